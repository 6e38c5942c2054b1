"""A run's learning curves (``curves.png``) and its first-vs-last summary table.

Every domain draws its ``metrics.jsonl`` (:mod:`rlpost.core.io.metrics`) through these:
it names its panels and their labels, nothing else. matplotlib is imported when a plot
is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlpost.core.io.metrics import read_metrics

Panel = tuple[str, tuple[str, ...]]
"""``(title, metric keys)``: one subplot, one curve per key present in the log."""


def plot_curves(
    run_dir: str | Path,
    panels: Sequence[Panel],
    labels: Mapping[str, str] | None = None,
    title: str = "",
    eval_prefix: str = "eval/",
) -> Path:
    """``run_dir/curves.png``: one subplot per panel, each key a curve vs ``step`` (keys
    starting with ``eval_prefix``, the held-out points, with markers); ``labels`` names
    the curves in the legend (default: the key)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    labels = labels or {}
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (name, keys) in zip(axes[0], panels, strict=True):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                style = "o-" if key.startswith(eval_prefix) else "-"
                ax.plot(*zip(*pts, strict=True), style, label=labels.get(key, key), lw=1.2, ms=3)
        if len(ax.lines) > 1:
            ax.legend(fontsize=7)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_table(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """First and last logged value of each of ``keys`` that the run logged."""
    width = max(20, *(len(k) + 2 for k in keys)) if keys else 20
    lines = [f"{'metric':<{width}}{'first':>10}{'last':>10}"]
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        if vals:
            lines.append(f"{k:<{width}}{vals[0]:>10.4f}{vals[-1]:>10.4f}")
    return "\n".join(lines) if len(lines) > 1 else "(no steps)"


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def write_summary(
    run_dir: str | Path,
    domain: str,
    rows: Sequence[Mapping[str, Any]],
    seconds: float,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """``<run_dir>/summary.json``, one shape in every domain: ``domain``, ``run_dir``,
    ``steps`` (the last logged step), ``seconds``; ``first`` / ``last``: the numeric
    metrics of the first and last logged rows; ``before`` / ``after``: the evaluation
    before and after training (by default the ``eval/`` metrics of the first and last rows
    that have any); then any ``extra`` keys of the domain."""
    evals = [_numbers({k: v for k, v in r.items() if k.startswith("eval/")}) for r in rows]
    evals = [e for e in evals if e]
    summary = {
        "domain": domain,
        "run_dir": str(run_dir),
        "steps": rows[-1].get("step", len(rows)) if rows else 0,
        "seconds": round(float(seconds), 1),
        "first": _numbers(rows[0]) if rows else {},
        "last": _numbers(rows[-1]) if rows else {},
        "before": dict(before) if before is not None else (evals[0] if evals else {}),
        "after": dict(after) if after is not None else (evals[-1] if evals else {}),
        **extra,
    }
    import json
    import os

    path = Path(run_dir) / "summary.json"
    tmp = path.with_name(f"summary.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    tmp.replace(path)
    return path
