"""Subspace-Aligned Rewiring (SAR, catalog 004-19): keep the part of an RL update that lies
in the base model's spectral subspace, drop the rest.

For a weight matrix with base ``W0 = U S V^T`` and update ``dW = W_ft - W0``, the
spectral subspace is spanned by the top ``r`` singular vectors ``U_r``, ``V_r`` of ``W0``:
``r`` given (``rank``), or the smallest ``r`` whose singular values hold ``energy`` of
``sum s_i^2``. The retained update is the two-sided projection

```
dW_core = U_r (U_r^T dW V_r) V_r^T
```

whose ``r x r`` core ``C = U_r^T dW V_r`` is all that is new (the bases are the base
model's own): SAR's compact reasoning core, ``r^2`` numbers per matrix. The orthogonal
part ``dW - dW_core`` is dropped. A tensor that is not a matrix (norms, biases) keeps its
update (``keep_vectors``) or drops it. :func:`merge` adds several experts' cores to one
base (weights ``lam``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rewired:
    delta: Tensor  # the retained update, the tensor's shape
    rank: int  # r (the tensor's numel for a kept vector; 0: dropped)
    core_params: int  # numbers that define the retained update (r^2; numel for a vector)
    params: int  # the tensor's numel
    norm_share: float  # ||retained||^2 / ||update||^2


def subspace(
    w0: Tensor, rank: int | None = None, energy: float | None = None
) -> tuple[Tensor, Tensor]:
    """``(U_r, V_r)``: the top singular vectors of ``w0`` (``[m, n]``), ``rank`` of them, or
    the fewest holding ``energy`` of the squared singular values."""
    if (rank is None) == (energy is None):
        raise ValueError("give exactly one of rank and energy")
    u, s, vh = torch.linalg.svd(w0.double(), full_matrices=False)
    if rank is None:
        cum = torch.cumsum(s**2, 0) / (s**2).sum().clamp_min(1e-300)
        rank = int((cum < energy - 1e-12).sum()) + 1
    r = max(1, min(rank, len(s)))
    return u[:, :r], vh[:r].T


def rewire(
    w0: Tensor,
    delta: Tensor,
    rank: int | None = None,
    energy: float | None = None,
    keep_vectors: bool = True,
) -> Rewired:
    """SAR on one tensor (see the module docstring)."""
    total = float((delta.double() ** 2).sum())
    if w0.dim() != 2:
        kept = delta if keep_vectors else torch.zeros_like(delta)
        n = delta.numel()
        return Rewired(kept, n if keep_vectors else 0, n if keep_vectors else 0, n,
                       1.0 if keep_vectors else 0.0)  # fmt: skip
    u, v = subspace(w0, rank, energy)
    core = u.T @ delta.double() @ v
    kept = u @ core @ v.T
    share = float((kept**2).sum()) / total if total > 0 else 1.0
    r = u.shape[1]
    return Rewired(kept.to(delta.dtype), r, r * r, delta.numel(), share)


def merge(
    base: dict[str, Tensor], cores: list[dict[str, Tensor]], lam: list[float] | None = None
) -> dict[str, Tensor]:
    """``base + sum_k lam_k core_k`` per tensor (``lam`` default 1 each)."""
    lam = lam if lam is not None else [1.0] * len(cores)
    if len(lam) != len(cores):
        raise ValueError(f"{len(cores)} experts but {len(lam)} weights")
    out = {}
    for k, w in base.items():
        out[k] = w + sum(wt * c[k] for wt, c in zip(lam, cores, strict=True) if k in c)
    return out
