"""The digits data: scikit-learn's 8x8 digits, the fixed split, prompts and model space."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: Number of classes (digits 0-9) and pixels per image.
N_CLASSES = 10
N_PIXELS = 64


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed split; images ``[N, 1, 8, 8]`` float32 in [0, 1], labels ``[N]`` int64."""

    train_images: Tensor
    train_labels: Tensor
    heldout_images: Tensor
    heldout_labels: Tensor


@functools.cache
def digits_split(n_train: int = 1500, seed: int = 0) -> DigitsSplit:
    """scikit-learn's digits, split by a seeded permutation (numpy PCG64, stable).

    The default ``(1500, 0)`` split is the one every builder and reward uses. Cached:
    treat the returned tensors as read-only.
    """
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    with torch.inference_mode(False):  # cached: must be usable by later training
        images = torch.from_numpy(data.images.astype(np.float32) / 16.0).unsqueeze(1)
        labels = torch.from_numpy(data.target.astype(np.int64))
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(labels)))
        tr, ho = perm[:n_train], perm[n_train:]
        return DigitsSplit(images[tr], labels[tr], images[ho], labels[ho])


@functools.cache
def class_ink_medians() -> Tensor:
    """``[10]``: per class, the median ink mass (mean pixel intensity in [0, 1]) of the
    real training images of that class; the "bold" threshold of the GenEval-like reward."""
    split = digits_split()
    ink = split.train_images.mean(dim=(1, 2, 3))
    return torch.stack([ink[split.train_labels == c].median() for c in range(N_CLASSES)])


def to_model_space(images: Tensor) -> Tensor:
    """Images in [0, 1] -> model space ``2 * image - 1`` in [-1, 1]."""
    return images * 2.0 - 1.0


def parse_digit_prompts(prompts: Sequence[Any] | Tensor) -> Tensor:
    """Class ids ``[B]`` (int64, CPU) from prompts: ints 0-9 or strings ``"0"``-``"9"``.

    Also accepts a 1-D integer tensor. Anything else (floats, bools, ``"seven"``, 10)
    raises ``ValueError`` naming the bad prompt and its index.
    """
    if isinstance(prompts, Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype == torch.bool or prompts.ndim != 1:
            raise ValueError(
                f"digit prompts as a tensor must be 1-D integer, got {prompts.dtype} "
                f"of shape {tuple(prompts.shape)}"
            )
        prompts = prompts.tolist()
    labels = []
    for i, p in enumerate(prompts):
        value: int | None = None
        if isinstance(p, Tensor) and p.ndim == 0 and not p.dtype.is_floating_point:
            p = p.item()
        if isinstance(p, numbers.Integral) and not isinstance(p, bool):
            value = int(p)
        elif isinstance(p, str) and len(p.strip()) == 1 and p.strip().isdigit():
            value = int(p.strip())
        if value is None or not 0 <= value < N_CLASSES:
            raise ValueError(
                f"invalid digit prompt {p!r} at index {i}: expected an int 0-9 or a string '0'-'9'"
            )
        labels.append(value)
    return torch.tensor(labels, dtype=torch.long)


def mean_ink(images: Tensor) -> Tensor:
    """``[B]``: mean pixel intensity over channels and pixels (ink mass; 1 = all ink)."""
    return images.float().mean(dim=tuple(range(1, images.ndim)))
