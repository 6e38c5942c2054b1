"""Numerically safe ratio helpers shared by the ratio and objective registries."""

from __future__ import annotations

from torch import Tensor

# log-ratio bound before exp: e^40 ~ 2.4e17, so a ratio times an advantage, summed over
# a batch of tokens, stays far below float32's max (~3.4e38 = e^88.7)
LOG_RATIO_MAX = 40.0


def safe_ratio(log_ratio: Tensor) -> Tensor:
    """``exp(min(log_ratio, LOG_RATIO_MAX))``: the policy ratio without overflow.

    Identical to ``exp`` below the bound; above it the value saturates and the gradient is
    0 (the clamp's), so a branch that ``torch.where`` / ``minimum`` discards can never
    contribute ``0 * inf = NaN`` to the backward pass.
    """
    return log_ratio.clamp(max=LOG_RATIO_MAX).exp()
