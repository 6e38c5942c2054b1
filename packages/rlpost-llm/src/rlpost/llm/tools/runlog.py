"""Run outputs of the LLM trainer: which curves and summary rows it shows.

Drawing, the table and the JSONL / TensorBoard log are shared by every domain
(:mod:`rlpost.core.io.curves`, :mod:`rlpost.core.io.metrics`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.core.io import curves
from rlpost.core.io.curves import Panel
from rlpost.core.io.metrics import MetricsLogger, read_metrics

__all__ = ["MetricsLogger", "plot_curves", "read_metrics", "summary_table"]


PANELS: list[Panel] = [
    ("reward (train)", ("reward/mean",)),
    ("accuracy", ("accuracy", "eval/accuracy")),
    ("policy entropy (nats/token)", ("entropy",)),
    ("response length (tokens)", ("response_length",)),
]
LABELS = {"reward/mean": "train", "accuracy": "train", "eval/accuracy": "held-out (greedy)"}
VALUE_PANEL: Panel = ("critic: value loss", ("value/loss",))
DISTILL_PANEL: Panel = ("reverse KL to the teacher (nats/token)", ("distill/kl",))
SUMMARY_KEYS = [
    "reward/mean",
    "accuracy",
    "entropy",
    "response_length",
    "kl",
    "distill/kl",
    "clip_frac",
    "rollout/sync_mb",  # (Ray workers: the weights sent per step; LoRA: adapters after the first)
]


def plot_curves(
    run_dir: Path,
    title: str = "",
    panels: list[Panel] | None = None,
    labels: dict[str, str] | None = None,
) -> Path:
    """``curves.png``: one panel per ``(title, keys)`` of ``panels`` (default: reward,
    train / held-out accuracy, entropy, length, and when the run has them the critic's
    value loss, the reverse KL to a teacher and each task's held-out accuracy); see
    :func:`rlpost.core.io.curves.plot_curves`."""
    if panels is None:
        rows = read_metrics(run_dir)
        keys = {k for r in rows for k in r}
        per_task = sorted(
            k
            for k in keys
            if k.startswith("eval/") and k.endswith("/accuracy") and k.count("/") == 2
        )
        panels = PANELS + [p for p in (VALUE_PANEL, DISTILL_PANEL) if p[1][0] in keys]
        if per_task:
            panels.append(("held-out accuracy per task", tuple(per_task)))
    return curves.plot_curves(run_dir, panels, LABELS if labels is None else labels, title)


def summary_table(rows: list[dict[str, Any]], keys: list[str] | None = None) -> str:
    """First vs last value of the main curves (``keys``, default the GRPO trainer's), and
    held-out accuracy."""
    keys = SUMMARY_KEYS if keys is None else keys
    return curves.summary_table(
        rows, [*keys, *([] if "eval/accuracy" in keys else ["eval/accuracy"])]
    )
