"""Masked reductions and group statistics, vectorised over the batch.

Shapes: ``x`` and ``mask`` broadcast together (typically ``[B, T]``); ``mask`` is
bool or 0/1 float. A reduction over zero valid elements returns 0, never NaN. Masked
entries never contribute, whatever they hold: padding that is ``-inf`` or NaN (e.g. the
log-prob of a pad token) is replaced by 0 with ``torch.where`` before any arithmetic, so
it reaches neither the result nor, through ``0 * inf``, the gradient (the gradient of a
masked entry is exactly 0).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def _m(x: Tensor, mask: Tensor | None) -> Tensor:
    return torch.ones_like(x) if mask is None else mask.to(x.dtype).expand_as(x)


def _valid(x: Tensor, m: Tensor) -> Tensor:
    """``x`` with masked entries replaced by 0 (so -inf / NaN padding cannot leak)."""
    return torch.where(m > 0, x, torch.zeros_like(x))


def masked_sum(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """sum(x * mask) over ``dim`` (all elements when ``dim`` is None); masked x never read."""
    m = _m(x, mask)
    xm = _valid(x, m) * m
    return xm.sum() if dim is None else xm.sum(dim)


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
    x = _valid(x, m)
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
    x = _valid(x, m)
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


def _dense_index(group_ids: Tensor | None, n: int, device: torch.device) -> tuple[Tensor, int]:
    """Dense group index in [0, G) for ``[B]`` labels (``None``: one group) and G."""
    if group_ids is None:
        return torch.zeros(n, dtype=torch.long, device=device), 1 if n else 0
    if group_ids.dim() != 1 or group_ids.shape[0] != n:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != [B] with B={n}")
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_sum(values: Tensor, group_ids: Tensor | None) -> Tensor:
    """Per-element group sum: ``out[i] = sum_{j: group_ids[j] == group_ids[i]} values[j]``.

    ``values``: ``[B]`` or ``[B, ...]`` (trailing dims summed independently).
    ``group_ids``: ``[B]`` integer labels, ``None`` for one group. Returns a tensor shaped
    like ``values`` on its device and dtype; differentiable (one ``index_add_`` and a
    gather, no loop over groups).
    """
    if values.dim() == 0:
        raise ValueError("group_sum expects values with a leading batch dim [B, ...]")
    index, n_groups = _dense_index(group_ids, values.shape[0], values.device)
    index = index.to(values.device)
    totals = values.new_zeros((n_groups, *values.shape[1:])).index_add(0, index, values)
    return totals[index]


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
