"""Masked reductions and group statistics, vectorised over the batch.

Shapes: ``x`` and ``mask`` broadcast together (typically ``[B, T]``); ``mask`` is
bool or 0/1 float. A reduction over zero valid elements returns 0, never NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def _m(x: Tensor, mask: Tensor | None) -> Tensor:
    return torch.ones_like(x) if mask is None else mask.to(x.dtype).expand_as(x)


def masked_sum(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """sum(x * mask) over ``dim`` (all elements when ``dim`` is None)."""
    m = _m(x, mask)
    return (x * m).sum() if dim is None else (x * m).sum(dim)


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """sum(x * mask) / max(sum(mask), 1): 0 where nothing is valid."""
    m = _m(x, mask)
    total = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / total.clamp_min(1.0)


def masked_var(
    x: Tensor, mask: Tensor | None = None, dim: int | None = None, unbiased: bool = True
) -> Tensor:
    """Masked variance; the unbiased form divides by (n - 1) and gives 0 for n <= 1."""
    m = _m(x, mask)
    n = m.sum() if dim is None else m.sum(dim)
    mean = masked_mean(x, m, dim)
    mean = mean if dim is None else mean.unsqueeze(dim)
    sq = masked_sum((x - mean) ** 2, m, dim)
    denom = (n - 1.0) if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp_min(1.0), torch.zeros_like(sq))


def masked_whiten(
    x: Tensor, mask: Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8
) -> Tensor:
    """(x - mean) / (std + eps) with statistics over the valid elements; masked entries -> 0."""
    m = _m(x, mask)
    mean = masked_mean(x, m)
    std = masked_var(x, m).sqrt()
    out = (x - mean) / (std + eps) if shift_mean else x / (std + eps)
    return out * m


class GroupStats(NamedTuple):
    """Per-element statistics of the element's group (all shaped like the rewards, ``[B]``)."""

    mean: Tensor
    std: Tensor  # unbiased (n - 1), 0 for singleton groups
    count: Tensor
    index: Tensor  # dense group index in [0, G)


def group_stats(values: Tensor, group_ids: Tensor | None) -> GroupStats:
    """Mean / std / size of each element's group, without a Python loop over groups.

    ``values``: ``[B]`` float. ``group_ids``: ``[B]`` integer labels (any values; responses
    with the same label were sampled for the same prompt). ``None`` puts all in one group.
    """
    if values.dim() != 1:
        raise ValueError(f"group_stats expects [B] values, got shape {tuple(values.shape)}")
    if group_ids is None:
        group_ids = torch.zeros_like(values, dtype=torch.long)
    if group_ids.shape != values.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(values.shape)}"
        )
    _, index = torch.unique(group_ids, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    v = values.to(torch.float64)  # sums of many rewards: accumulate in float64
    count = torch.zeros(n_groups, dtype=v.dtype, device=v.device).index_add_(
        0, index, torch.ones_like(v)
    )
    total = torch.zeros_like(count).index_add_(0, index, v)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, index, (v - mean[index]) ** 2)
    var = torch.where(count > 1, sq / (count - 1).clamp_min(1), torch.zeros_like(sq))
    dt = values.dtype
    return GroupStats(mean[index].to(dt), var.sqrt()[index].to(dt), count[index].to(dt), index)
