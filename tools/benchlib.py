"""Shared helpers for the repo's benchmarks (stdlib + torch + numpy only).

Every benchmark writes one JSON file with the same top-level layout::

    {name, catalog_ids, command, machine, config, seeds, rows, headline}

where ``headline = {metric, value, baseline, ratio, paper}`` (``paper`` may be null).
Use :func:`machine_info` for ``machine``, :func:`write_result` to write the file,
:func:`print_table` for console output and :func:`mean_std` for summary statistics.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

OPTIONAL_PACKAGES = (
    "transformers",
    "diffusers",
    "gymnasium",
    "mujoco",
    "lerobot",
    "vllm",
    "triton",
)
RESULT_KEYS = ("name", "catalog_ids", "command", "machine", "config", "seeds", "rows", "headline")
HEADLINE_KEYS = ("metric", "value", "baseline", "ratio", "paper")


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    """Installed version of a distribution (without importing it), or None."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Describe the machine and software stack a benchmark ran on."""
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # other processes share the CPUs: a load above the core count skews timings
        "load_avg_1_5_15m": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": {
            "torch": torch.__version__,
            "numpy": np.__version__,
            **{name: _version(name) for name in OPTIONAL_PACKAGES},
        },
    }


def command_line() -> str:
    """The command that started this process, rebuilt from ``sys.argv`` (shell-quoted)."""
    return "python " + shlex.join(sys.argv)


def _jsonable(x: Any) -> Any:
    """Plain-JSON copy of ``x``: numpy/torch values to Python, non-finite floats to None."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None  # JSON has no NaN / inf
    if isinstance(x, Path):
        return str(x)
    return x


def write_result(
    path: str | os.PathLike[str],
    *,
    name: str,
    catalog_ids: Sequence[str],
    config: Mapping[str, Any],
    seeds: Sequence[int],
    rows: Sequence[Mapping[str, Any]],
    headline: Mapping[str, Any],
) -> Path:
    """Write one benchmark result as JSON, atomically (temp file + ``os.replace``).

    ``headline`` must have the keys ``metric, value, baseline, ratio, paper`` (in that
    order in the file); a benchmark may add its own after them.
    ``command`` and ``machine`` are filled in here. Parent directories are created.
    Non-finite floats are written as null. Returns the path written.
    """
    missing = [k for k in HEADLINE_KEYS if k not in headline]
    if missing:
        raise ValueError(f"headline keys must include {HEADLINE_KEYS}, missing {missing}")
    result = {
        "name": name,
        "catalog_ids": list(catalog_ids),
        "command": command_line(),
        "machine": machine_info(),
        "config": dict(config),
        "seeds": list(seeds),
        "rows": [dict(r) for r in rows],
        "headline": {**{k: headline[k] for k in HEADLINE_KEYS}, **headline},
    }
    text = json.dumps(_jsonable(result), indent=2, allow_nan=False) + "\n"
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{v:,}"
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e4):
        return f"{v:,.0f}"
    if v != 0 and abs(v) < 1e-3:
        return f"{v:.2e}"
    return f"{v:.4g}"


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str | tuple[str, str]]) -> str:
    """Print ``rows`` (dicts) as an aligned plain-text table and return the text.

    ``columns``: keys, or ``(key, header)`` pairs. Numbers are right-aligned; missing
    values print as ``-``.
    """
    cols = [(c, c) if isinstance(c, str) else c for c in columns]
    rows = list(rows)
    cells = [[_fmt(r.get(key)) for key, _ in cols] for r in rows]
    numeric = [
        all(
            isinstance(r.get(key), (int, float, np.number, type(None)))
            and not isinstance(r.get(key), bool)
            for r in rows
        )
        for key, _ in cols
    ]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, (_, h) in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    text = "\n".join(
        [
            line([h for _, h in cols]),
            line(["-" * w for w in widths]),
            *(line(row) for row in cells),
        ]
    )
    print(text, flush=True)
    return text


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with ddof=1); std is 0.0 for a single value."""
    a = np.asarray(list(values), dtype=np.float64)
    if a.size == 0:
        raise ValueError("mean_std of an empty sequence")
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return float(a.mean()), std


def seed_row(key: str, name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's row (``{key: name}``) from its runs, one per seed: the mean and the
    spread (``<metric>_std``) of every float the first run reports."""
    row: dict[str, Any] = {key: name}
    for k, v in runs[0].items():
        if isinstance(v, float):
            row[k], row[f"{k}_std"] = mean_std(r[k] for r in runs)
    return row


def curve_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's row from its runs (each with ``curve``: ``[(step, value), ...]``):
    the first run's value at the start, the mean and spread of the last value over runs,
    the mean best value, the mean area under the curve (mean value), and the curves."""
    curves = [r["curve"] for r in runs]
    row: dict[str, Any] = {"method": name, "before": curves[0][0][1]}
    row["after"], row["after_std"] = mean_std(c[-1][1] for c in curves)
    row["best"], _ = mean_std(max(v for _, v in c) for c in curves)
    row["auc"], _ = mean_std(sum(v for _, v in c) / len(c) for c in curves)
    row["curves"] = curves
    return row


def in_turns(names: Sequence[str], repeats: int, run) -> dict[str, list[float]]:
    """``{name: [seconds per repeat]}``: the variants ``names`` take turns ``repeats``
    times, in an order rotating by one each repeat, so that a machine's drift falls on all
    of them alike. Each turn calls ``run(name)`` once untimed (the first call after
    another variant's pays for the switch) and keeps the median of the next three."""
    import statistics
    import time

    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        k = i % len(names)
        for name in [*names[k:], *names[:k]]:
            run(name)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                run(name)
                times.append(time.perf_counter() - t0)
            out[name].append(statistics.median(times))
    return out


def proc_status_mib(key: str) -> float | None:
    """A kB field of /proc/self/status (``VmHWM`` peak RSS, ``VmRSS``) in MiB; None off Linux.

    ``VmHWM`` is the peak of *this* process image, unlike ``ru_maxrss`` of a child, which
    starts at its parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def run_pool(
    fn: Any, jobs: Sequence[dict[str, Any]], workers: int, describe: Any
) -> list[dict[str, Any]]:
    """Run ``fn(job)`` for every job in ``workers`` spawned processes; print
    ``describe(result)`` with progress as each finishes; return the results (finish order)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import time

    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(fn, j) for j in jobs]):
            results.append(fut.result())
            print(
                f"  done {describe(results[-1])}  "
                f"[{len(results)}/{len(jobs)}, {time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
    return results


def plot_mean_curves(
    curves: Mapping[str, Sequence[Sequence[Sequence[float]]]],
    path: str | os.PathLike[str],
    *,
    x: int,
    y: int,
    xlabel: str,
    ylabel: str,
    title: str,
) -> None:
    """One line per method: the mean over seeds of ``curve[i][y]`` against ``curve[i][x]``
    (``curves[name]`` holds one curve per seed, sampled at the same points); saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, runs in curves.items():
        xs = [p[x] for p in runs[0]]
        ys = [sum(r[i][y] for r in runs) / len(runs) for i in range(len(xs))]
        ax.plot(xs, ys, marker="o", ms=3, label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def method_overrides(ap, items: list[str], methods) -> dict[str, list[str]]:
    """``--set METHOD=OVERRIDE`` items as ``{method: [override, ...]}``; an unknown method
    or an empty override is an argparse error naming the valid methods."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, _, override = item.partition("=")
        if name not in methods or not override:
            ap.error(f"--set {item!r}: METHOD=OVERRIDE with METHOD one of {sorted(methods)}")
        out.setdefault(name, []).append(override)
    return out
