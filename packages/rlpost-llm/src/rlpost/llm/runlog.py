"""Run outputs of the LLM trainer: the final PNG curves and summary table.

The JSONL / TensorBoard logger is shared by every domain: :mod:`rlpost.core.io.metrics`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.core.io.metrics import MetricsLogger, read_metrics

__all__ = ["MetricsLogger", "plot_curves", "read_metrics", "summary_table"]


Panel = tuple[str, tuple[str, ...]]  # (title, metric keys drawn in it)

PANELS: list[Panel] = [
    ("reward (train)", ("reward/mean",)),
    ("accuracy", ("accuracy", "eval/accuracy")),
    ("policy entropy (nats/token)", ("entropy",)),
    ("response length (tokens)", ("response_length",)),
]
LABELS = {"reward/mean": "train", "accuracy": "train", "eval/accuracy": "held-out (greedy)"}
VALUE_PANEL: Panel = ("critic: value loss", ("value/loss",))
SUMMARY_KEYS = ["reward/mean", "accuracy", "entropy", "response_length", "kl", "clip_frac"]


def plot_curves(
    run_dir: Path,
    title: str = "",
    panels: list[Panel] | None = None,
    labels: dict[str, str] | None = None,
) -> Path:
    """``curves.png``: one panel per ``(title, keys)`` of ``panels`` (default: reward,
    train / held-out accuracy, entropy, length, and the critic's value loss when the run
    has one), each key a curve vs step; ``eval/`` keys (held-out points) with markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if panels is None:
        panels = PANELS + ([VALUE_PANEL] if any("value/loss" in r for r in rows) else [])
    labels = LABELS if labels is None else labels
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (label, keys) in zip(axes[0], panels, strict=True):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                style = "o-" if key.startswith("eval/") else "-"
                ax.plot(*zip(*pts, strict=True), style, label=labels.get(key, key), lw=1.2, ms=3)
        if len(ax.lines) > 1:
            ax.legend(fontsize=7)
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


def summary_table(rows: list[dict[str, Any]], keys: list[str] | None = None) -> str:
    """First vs last value of the main curves (``keys``, default the GRPO trainer's), and
    held-out accuracy before / after."""
    if not rows:
        return "(no steps)"
    keys = SUMMARY_KEYS if keys is None else keys
    width = max(22, max(len(k) for k in keys) + 2)
    lines = [f"{'metric':<{width}}{'first':>10}{'last':>10}"]
    for k in [*keys, *([] if "eval/accuracy" in keys else ["eval/accuracy"])]:
        vals = [r[k] for r in rows if k in r]
        if vals:
            lines.append(f"{k:<{width}}{vals[0]:>10.4f}{vals[-1]:>10.4f}")
    return "\n".join(lines)
