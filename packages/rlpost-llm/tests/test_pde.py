"""RLVP's hybrid physics verifier (catalog 004-07) on hand-written solvers."""

from __future__ import annotations

import random

from rlpost.llm.data.pde import describe, extract_code, magnitude_score, problem, verify
from rlpost.llm.data.tasks import PDETask, make_task

POISSON = {"family": "elliptic", "k": 2, "n": 33}
HEAT = {"family": "parabolic", "k": 1, "n": 21, "nu": 0.02, "T": 0.5, "m": 200}
ADVECT = {"family": "hyperbolic", "k": 1, "n": 64, "c": 1.0, "T": 0.5, "m": 200}

FD_POISSON = """
import numpy as np
def solve():
    n, k = 33, 2
    h = 1 / (n - 1)
    x = np.linspace(0, 1, n)
    A = (np.diag(2 * np.ones(n - 2)) - np.diag(np.ones(n - 3), 1) - np.diag(np.ones(n - 3), -1)) / h**2
    u = np.zeros(n)
    u[1:-1] = np.linalg.solve(A, (k * np.pi) ** 2 * np.sin(k * np.pi * x[1:-1]))
    return u
"""
ANALYTIC_POISSON = """
import numpy as np
def solve():
    return np.sin(2 * np.pi * np.linspace(0, 1, 33))
"""
HEAT_FTCS = """
import numpy as np
def solve():
    n, m, nu, T = 21, 200, 0.02, 0.5
    h, dt = 1 / (n - 1), T / m
    u = np.sin(np.pi * np.linspace(0, 1, n))
    rows = [u.copy()]
    for _ in range(m):
        u[1:-1] = u[1:-1] + nu * dt / h**2 * (u[2:] - 2 * u[1:-1] + u[:-2])
        rows.append(u.copy())
    return np.array(rows)
"""
ADVECT_SPECTRAL = """
import numpy as np
def solve():
    n, m, c, T = 64, 200, 1.0, 0.5
    x = np.arange(n) / n
    return np.array([np.sin(2 * np.pi * (x - c * j * T / m)) for j in range(m + 1)])
"""


def test_a_correct_solver_scores_high_and_the_physics_terms_are_graded(record_result):
    fd = verify(FD_POISSON, POISSON)
    assert fd.valid and fd.error < 1e-2 and fd.residual == 1.0  # it solves the discrete system
    analytic = verify(ANALYTIC_POISSON, POISSON)
    assert analytic.valid and analytic.accuracy == 1.0 and 0 < analytic.residual < 1.0
    zeros = verify("def solve():\n    return [0.0] * 33\n", POISSON)
    assert zeros.valid and zeros.accuracy < 1e-6 and zeros.reward < 0.1
    heat = verify(HEAT_FTCS, HEAT)
    assert heat.valid and heat.error < 1e-2 and heat.reward > 0.5
    adv = verify(ADVECT_SPECTRAL, ADVECT)
    assert adv.valid and adv.accuracy == 1.0 and adv.residual > 0.4
    assert magnitude_score(1e-7) == 1.0 and magnitude_score(1e-3) == 0.5
    assert magnitude_score(10.0) == 0.0 and magnitude_score(float("nan")) == 0.0
    solvers = {"finite differences, Poisson": fd, "analytic, Poisson": analytic}
    solvers |= {"zeros, Poisson": zeros, "explicit Euler (FTCS), heat": heat}
    solvers |= {"exact advection": adv}
    keys = ("valid", "error", "accuracy", "residual", "reward")
    rows = [{"solver": k, **{f: getattr(v, f) for f in keys}} for k, v in solvers.items()]
    record_result("rlvp_solvers", rows, catalog_ids=["004-07"])


def test_validity_is_a_hard_check():
    for code, why in (
        ("def solve():\n    while True:\n        pass\n", "did not run"),
        ("def solve():\n    return [1.0, 2.0]\n", "shape"),
        ("def solve():\n    return [float('nan')] * 33\n", "non-finite"),
        ("import os\nos.system('echo hi > /tmp/pwned')\ndef solve():\n    return [0.0]*33\n", ""),
        ("syntax error here", "did not run"),
        ("def solve():\n    return 'text'\n", ""),
    ):
        v = verify(code, POISSON, timeout_s=3)
        if why:
            assert not v.valid and v.reward == 0.0 and why in v.why, (code, v)
    import os

    assert not os.path.exists("/tmp/pwned")  # the sandbox kept it in


def test_a_result_linked_to_a_host_file_is_not_read(tmp_path):
    import json
    import os

    from rlpost.llm.data.pde import exact

    answer = tmp_path / "answer.json"  # a host file holding the exact solution
    answer.write_text(json.dumps(exact(POISSON).tolist()))
    for target in (str(answer), "/dev/stdin"):  # a link out, and a link to something that blocks
        code = f"import os\nos.symlink({target!r}, 'result.json')\nos._exit(0)\n"
        v = verify(code, POISSON, timeout_s=5)
        assert not v.valid and v.reward == 0.0 and "no result" in v.why, v
    code = "import os\nos.mkfifo('result.json')\nos._exit(0)\n"  # a FIFO would block a read
    assert "no result" in verify(code, POISSON, timeout_s=5).why
    assert os.path.exists(answer)


def test_the_task_samples_prompts_and_scores_completions():
    task = make_task("pde")
    assert isinstance(task, PDETask)
    exs = task.sample(6, random.Random(0))
    assert {e.meta["pde"]["family"] for e in exs} <= {"elliptic", "parabolic", "hyperbolic"}
    assert all("solve()" in e.prompt for e in exs)
    ex = next(e for e in exs if e.meta["pde"]["family"] == "elliptic")
    p = ex.meta["pde"]
    code = ANALYTIC_POISSON.replace("2 * np.pi", f"{p['k']} * np.pi").replace("33", str(p["n"]))
    assert task.score(f"Here:\n```python\n{code}```\n", ex) > 0.5
    assert extract_code("no fences") == "no fences"
    assert "Poisson" in describe(problem("elliptic", random.Random(1)))
