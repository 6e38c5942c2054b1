"""VIGOR (catalog 001-03): a verifier-free reward from the policy's own gradients.

For a completion ``y`` of ``T`` tokens, ``g(y) = grad_theta (1/T) sum_t -log pi_theta(y_t |
x, y_<t)``, the teacher-forced mean-NLL gradient under the current parameters. A smaller
``||g||`` means the completion agrees with the current policy, the intrinsic preference.
Averaging ``T`` token gradients shrinks the norm like ``1/sqrt(T)`` where the token
gradients are close to independent, a length bias towards long completions;
:func:`length_corrected` multiplies by ``sqrt(T)``. :func:`group_rank_rewards` then turns
the scores into rewards by their rank within the prompt's group (smallest score, highest
reward), so reward scales are the same for every prompt.
"""

from __future__ import annotations

import torch
from torch import Tensor


def length_corrected(grad_norms: Tensor, lengths: Tensor) -> Tensor:
    """``||g|| sqrt(T)`` for each completion of ``T`` tokens."""
    return grad_norms * lengths.to(grad_norms.dtype).clamp_min(1).sqrt()


def group_rank_rewards(scores: Tensor, group: Tensor) -> Tensor:
    """``[B]`` in ``[0, 1]``: each row's share of its group's other rows with a larger score
    (ties count a half), so the smallest score of a group of ``n`` gets 1 and the largest
    0; a group of one gets 0.5."""
    same = group[:, None] == group[None, :]
    larger = ((scores[None, :] > scores[:, None]) & same).sum(1).to(scores.dtype)
    ties = ((scores[None, :] == scores[:, None]) & same).sum(1).to(scores.dtype) - 1
    others = same.sum(1).to(scores.dtype) - 1
    return torch.where(others > 0, (larger + 0.5 * ties) / others.clamp_min(1), 0.5)
