"""Run outputs of the LLM trainer: the final PNG curves and summary table.

The JSONL / TensorBoard logger is shared by every domain: :mod:`rlpost.core.io.metrics`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.core.io.metrics import MetricsLogger, read_metrics

__all__ = ["MetricsLogger", "plot_curves", "read_metrics", "summary_table"]


PANELS = [
    ("reward/mean", "reward (train)"),
    ("accuracy", "accuracy"),
    ("entropy", "policy entropy (nats/token)"),
    ("response_length", "response length (tokens)"),
]


def plot_curves(run_dir: Path, title: str = "") -> Path:
    """``curves.png``: reward, train/held-out accuracy, entropy and length vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), label="train", lw=1.2)
        if key == "accuracy":
            ev = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
            if ev:
                ax.plot(*zip(*ev, strict=True), "o-", label="held-out (greedy)", lw=1.5)
            ax.legend(fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_table(rows: list[dict[str, Any]]) -> str:
    """First vs last value of the main curves, and held-out accuracy before / after."""
    if not rows:
        return "(no steps)"
    keys = ["reward/mean", "accuracy", "entropy", "response_length", "kl", "clip_frac"]
    lines = [f"{'metric':<22}{'first':>10}{'last':>10}"]
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        if vals:
            lines.append(f"{k:<22}{vals[0]:>10.4f}{vals[-1]:>10.4f}")
    ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    if ev:
        lines.append(f"{'eval/accuracy':<22}{ev[0]:>10.4f}{ev[-1]:>10.4f}")
    return "\n".join(lines)
