"""PDE-solver code generation with RLVP's hybrid physics verifier (catalog 004-07).

Each problem asks for a Python function ``solve()`` that returns a numerical solution of a
PDE with a known analytic solution, on a given grid. There are three families, as in the
abstract:

* ``elliptic``, Poisson: ``-u'' = (k pi)^2 sin(k pi x)`` on ``[0, 1]``,
  ``u(0) = u(1) = 0``; ``u = sin(k pi x)``; ``solve()`` returns ``u[i]`` at
  ``x_i = i / (n - 1)``.
* ``parabolic``, heat: ``u_t = nu u_xx``, ``u(x, 0) = sin(k pi x)``, zero boundaries;
  ``u = exp(-nu (k pi)^2 t) sin(k pi x)``; ``solve()`` returns ``u[j][i]`` at
  ``t_j = j T / m``.
* ``hyperbolic``, advection: ``u_t + c u_x = 0``, periodic on ``[0, 1)``,
  ``u(x, 0) = sin(2 pi k x)``; ``u = sin(2 pi k (x - c t))``; ``x_i = i / n``.

:func:`verify` is the hybrid verifier.

1. **Validity**, a hard check. The code runs in :func:`rlpost.llm.data.sandbox.run_sandboxed`
   (CPU, memory and time limits, no network, no writes outside its directory). It must
   define ``solve`` and return an array of the asked shape, all finite. Otherwise the
   reward is 0.
2. **Accuracy**, continuous: the relative L2 error against the analytic solution, scored
   by orders of magnitude, ``clip(1 - log10(err / 1e-6) / 6, 0, 1)``. An error of 1e-6 or
   less scores 1; an error of 1 or more scores 0.
3. **Residual**, continuous: the relative norm of the PDE's residual evaluated on the
   returned values with the verifier's own finite differences, scored the same way. It
   rewards a solution that is consistent with the equation, not just close to the answer.

The reward is ``validity * (w_acc * accuracy + (1 - w_acc) * residual)``.
:class:`rlpost.llm.data.tasks.PDETask` puts the problems behind the task protocol
(``data.task: pde``), for a code model that writes Python; the prompts are English.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

FAMILIES = ("elliptic", "parabolic", "hyperbolic")

_HARNESS = """

if __name__ == "__main__":
    import json as _json
    import math as _math
    _out = solve()
    _out = _out.tolist() if hasattr(_out, "tolist") else _out
    with open("result.json", "w") as _f:
        _json.dump(_out, _f)
"""


def problem(family: str, rng: random.Random) -> dict[str, Any]:
    k = rng.randint(1, 3)
    if family == "elliptic":
        return {"family": family, "k": k, "n": 33}
    if family == "parabolic":
        return {"family": family, "k": k, "n": 21, "nu": round(rng.uniform(0.01, 0.05), 3),
                "T": 0.5, "m": 200}  # fmt: skip
    if family == "hyperbolic":
        return {"family": family, "k": k, "n": 64, "c": round(rng.uniform(0.5, 1.5), 2),
                "T": 0.5, "m": 200}  # fmt: skip
    raise ValueError(f"unknown PDE family {family!r}; valid: {', '.join(FAMILIES)}")


def describe(p: dict[str, Any]) -> str:
    f = p["family"]
    if f == "elliptic":
        return (
            f"Write a Python function solve() (numpy is available) that solves the Poisson "
            f"equation -u''(x) = ({p['k']} pi)^2 sin({p['k']} pi x) on [0, 1] with "
            f"u(0) = u(1) = 0, and returns u at the {p['n']} points x_i = i/{p['n'] - 1}."
        )
    if f == "parabolic":
        return (
            f"Write a Python function solve() (numpy is available) that solves the heat "
            f"equation u_t = {p['nu']} u_xx on [0, 1] with u(x, 0) = sin({p['k']} pi x) and "
            f"u(0, t) = u(1, t) = 0, and returns a list of {p['m'] + 1} rows, row j the "
            f"solution at t_j = j*{p['T']}/{p['m']} on the {p['n']} points x_i = "
            f"i/{p['n'] - 1}."
        )
    return (
        f"Write a Python function solve() (numpy is available) that solves the advection "
        f"equation u_t + {p['c']} u_x = 0 on [0, 1) with periodic boundaries and u(x, 0) = "
        f"sin(2 pi {p['k']} x), and returns a list of {p['m'] + 1} rows, row j the solution "
        f"at t_j = j*{p['T']}/{p['m']} on the {p['n']} points x_i = i/{p['n']}."
    )


def exact(p: dict[str, Any]):
    import numpy as np

    f, k, n = p["family"], p["k"], p["n"]
    if f == "elliptic":
        x = np.linspace(0.0, 1.0, n)
        return np.sin(k * np.pi * x)
    t = np.linspace(0.0, p["T"], p["m"] + 1)[:, None]
    if f == "parabolic":
        x = np.linspace(0.0, 1.0, n)[None, :]
        return np.exp(-p["nu"] * (k * np.pi) ** 2 * t) * np.sin(k * np.pi * x)
    x = (np.arange(n) / n)[None, :]
    return np.sin(2 * np.pi * k * (x - p["c"] * t))


def residual(p: dict[str, Any], u) -> float:
    """Relative norm of the PDE residual of ``u`` under the verifier's own central
    differences (interior points; the time derivative by central differences in time)."""
    import numpy as np

    f, k, n = p["family"], p["k"], p["n"]
    if f == "elliptic":
        h = 1.0 / (n - 1)
        x = np.linspace(0.0, 1.0, n)
        lap = (u[2:] - 2 * u[1:-1] + u[:-2]) / h**2
        rhs = (k * np.pi) ** 2 * np.sin(k * np.pi * x[1:-1])
        r = -lap - rhs
        bc = np.abs([u[0], u[-1]]).sum()
        return float((np.linalg.norm(r) + bc) / (np.linalg.norm(rhs) + 1e-12))
    dt = p["T"] / p["m"]
    ut = (u[2:] - u[:-2]) / (2 * dt)  # [m-1, n]
    mid = u[1:-1]
    if f == "parabolic":
        h = 1.0 / (n - 1)
        uxx = (mid[:, 2:] - 2 * mid[:, 1:-1] + mid[:, :-2]) / h**2
        r = ut[:, 1:-1] - p["nu"] * uxx
        scale = np.linalg.norm(ut[:, 1:-1]) + np.linalg.norm(p["nu"] * uxx) + 1e-12
        bc = np.abs(u[:, [0, -1]]).sum() / u.shape[0]
        return float(np.linalg.norm(r) / scale + bc)
    h = 1.0 / n
    ux = (np.roll(mid, -1, axis=1) - np.roll(mid, 1, axis=1)) / (2 * h)
    r = ut + p["c"] * ux
    return float(np.linalg.norm(r) / (np.linalg.norm(ut) + np.linalg.norm(p["c"] * ux) + 1e-12))


def magnitude_score(err: float) -> float:
    """1 at an error of 1e-6 or less, 0 at 1 or more, linear in log10 between."""
    if not math.isfinite(err):
        return 0.0
    if err <= 1e-6:
        return 1.0
    return max(0.0, min(1.0, 1.0 - math.log10(err / 1e-6) / 6.0))


def extract_code(completion: str) -> str:
    """The last ```python block of ``completion`` (or the whole text when it has none)."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", completion, re.DOTALL)
    return blocks[-1] if blocks else completion


@dataclass(frozen=True)
class Verdict:
    valid: bool
    accuracy: float
    residual: float
    reward: float
    error: float | None  # the relative L2 error (None: invalid)
    why: str


def verify(code: str, p: dict[str, Any], w_acc: float = 0.5, timeout_s: float = 20.0) -> Verdict:
    """The hybrid verifier of the module docstring."""
    import numpy as np

    from rlpost.llm.data.sandbox import read_result, run_sandboxed

    res = run_sandboxed(code + _HARNESS, timeout_s=timeout_s, cpu_s=int(timeout_s), keep=True)
    try:
        if not res.ok:
            why = "timed out" if res.timed_out else (res.stderr.strip().splitlines() or ["?"])[-1]
            return Verdict(False, 0.0, 0.0, 0.0, None, f"did not run: {why}")
        raw = read_result(res.dir, "result.json")  # never through a link the code planted
        if raw is None:
            return Verdict(False, 0.0, 0.0, 0.0, None, "no result (solve() not called?)")
        try:
            u = np.asarray(json.loads(raw), dtype=float)
        except (ValueError, TypeError) as exc:
            return Verdict(False, 0.0, 0.0, 0.0, None, f"the result is not numbers: {exc}")
    finally:
        import shutil

        shutil.rmtree(res.dir, ignore_errors=True)
    ref = exact(p)
    if u.shape != ref.shape:
        return Verdict(False, 0.0, 0.0, 0.0, None, f"shape {u.shape}, expected {ref.shape}")
    if not np.isfinite(u).all():
        return Verdict(False, 0.0, 0.0, 0.0, None, "non-finite values")
    err = float(np.linalg.norm(u - ref) / (np.linalg.norm(ref) + 1e-12))
    acc, resid = magnitude_score(err), magnitude_score(residual(p, u))
    reward = w_acc * acc + (1.0 - w_acc) * resid
    return Verdict(True, acc, resid, reward, err, "ok")


__all__ = [
    "FAMILIES",
    "Verdict",
    "describe",
    "exact",
    "extract_code",
    "magnitude_score",
    "problem",
    "residual",
    "verify",
]
