"""Run outputs of the diffusion trainer: sample grids, curves and the summary table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from rlpost.core.io import curves
from rlpost.core.io.curves import Panel

PANELS: list[Panel] = [
    ("reward", ("reward/mean", "eval/reward")),
    ("class accuracy (classifier)", ("class_accuracy", "eval/class_accuracy")),
    ("||v_theta|| / ||v_ref|| (own trajectories)", ("eval/vnorm_ratio",)),
    ("loss", ("loss",)),
]
LABELS = {
    "reward/mean": "train",
    "eval/reward": "eval (ODE)",
    "class_accuracy": "train",
    "eval/class_accuracy": "eval (ODE)",
    "eval/vnorm_ratio": "eval (ODE)",
    "loss": "train",
}
SUMMARY_KEYS = [
    "reward/mean",
    "class_accuracy",
    "eval/reward",
    "eval/class_accuracy",
    "eval/vnorm_ratio",
    "kl",
    "clip_frac",
]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_grid(
    images: Tensor, prompts: Sequence[Any], path: Path, per_prompt: int, title: str = ""
) -> Path:
    """A PNG grid: one row per prompt, ``per_prompt`` samples per row, in [0, 1]."""
    plt = _plt()
    imgs = images.detach().float().cpu().clamp(0, 1)
    rows = max(1, len(imgs) // per_prompt)
    fig, axes = plt.subplots(
        rows, per_prompt, figsize=(per_prompt * 0.8, rows * 0.85), squeeze=False
    )
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= len(imgs):
            continue
        img = imgs[i]
        if img.shape[0] == 1:
            ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            ax.imshow(img.permute(1, 2, 0).numpy())
        if i % per_prompt == 0:
            ax.set_title(str(prompts[i])[:24], fontsize=7, loc="left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save_comparison(
    columns: dict[str, Tensor], prompts: Sequence[Any], path: Path, per_prompt: int, show: int = 4
) -> Path:
    """Side-by-side grid: one row per prompt, ``show`` samples from each column's images
    (same prompts and noise in every column, e.g. before / after each method)."""
    plt = _plt()
    names = list(columns)
    n_rows = len(prompts) // per_prompt
    fig, axes = plt.subplots(
        n_rows,
        len(names) * show,
        figsize=(len(names) * show * 0.6 + 0.4, n_rows * 0.65 + 0.4),
        squeeze=False,
    )
    for c, name in enumerate(names):
        imgs = columns[name].detach().float().cpu().clamp(0, 1)
        for r in range(n_rows):
            for k in range(show):
                ax = axes[r][c * show + k]
                ax.axis("off")
                img = imgs[r * per_prompt + k]
                if img.shape[0] == 1:
                    ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
                else:
                    ax.imshow(img.permute(1, 2, 0).numpy())
                if r == 0 and k == 0:
                    ax.set_title(name, fontsize=8, loc="left")
    fig.tight_layout(pad=0.3)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_curves(run_dir: Path, title: str = "") -> Path:
    """``curves.png``: train / eval reward, class accuracy, velocity-norm ratio, loss."""
    return curves.plot_curves(run_dir, PANELS, LABELS, title)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """First vs last value of the main metrics."""
    return curves.summary_table(rows, SUMMARY_KEYS)
