"""ATOD's Turn-level Disagreement-Uncertainty Reweighting (T-DUR, catalog 004-27).

In a long multi-turn trajectory not every turn's dense supervision is equally useful.
T-DUR softly amplifies the turns where the student disagrees with its teacher *and* is
uncertain. Our reading of the abstract (it names the two signals and "softly amplifies",
no formula): for turn u of trajectory b, over its distilled tokens,

    D_u = mean reverse-KL estimate to the teacher      (disagreement, detached)
    U_u = mean entropy of the student                   (uncertainty, detached)
    s_u = D_u^+ * U_u                                   (utility; D^+ = max(D, 0))
    w_u = (1 - alpha) + alpha * s_u / mean_{v in b} s_v (clipped to [0, w_max])

so the weights of a trajectory's turns average 1 before clipping (the distillation
signal is redistributed, not scaled), ``alpha = 0`` is uniform, and a trajectory whose
turns all have zero utility keeps weight 1. Without turn ids (single-turn trainers) each
response is one turn and its weight is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TurnReweight:
    alpha: float = 0.5
    w_max: float = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError("T-DUR: alpha must be in [0, 1]")
        if self.w_max < 1.0:
            raise ValueError("T-DUR: w_max must be >= 1")


def turn_weights(
    kl: Tensor, entropy: Tensor, mask: Tensor, turn_ids: Tensor | None, p: TurnReweight
) -> Tensor:
    """Detached ``[B, T]`` per-token weights, the weight of each token's turn (0 where
    ``mask`` is 0 or the token belongs to no turn, ``turn_ids == -1``)."""
    m = (mask > 0).to(kl.dtype)
    if turn_ids is None:
        return m
    valid = m * (turn_ids >= 0).to(kl.dtype)
    tid = turn_ids.clamp_min(0).long()
    U = int(tid.max()) + 1 if tid.numel() else 1
    B = kl.shape[0]

    def turn_mean(x: Tensor) -> tuple[Tensor, Tensor]:
        tot = torch.zeros(B, U, dtype=kl.dtype).scatter_add_(1, tid, x.detach() * valid)
        cnt = torch.zeros(B, U, dtype=kl.dtype).scatter_add_(1, tid, valid)
        return tot / cnt.clamp_min(1.0), cnt

    d, cnt = turn_mean(kl)
    u, _ = turn_mean(entropy)
    exists = cnt > 0
    s = d.clamp_min(0.0) * u.clamp_min(0.0) * exists
    n = exists.sum(1, keepdim=True).clamp_min(1)
    mean_s = s.sum(1, keepdim=True) / n
    ratio = torch.where(mean_s > 0, s / mean_s.clamp_min(1e-12), torch.ones_like(s))
    w = ((1.0 - p.alpha) + p.alpha * ratio).clamp(0.0, p.w_max)
    return w.gather(1, tid) * valid
