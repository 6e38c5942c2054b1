"""ASTOR (catalog 001-18): utility-driven coordination of multi-task RL.

A task's *utility* joins two signals:

* **learning potential** ``LP_k``: the expected size of a group-relative update on the
  task now, the mean over its recent groups of the normalised outcome uncertainty
  ``4 p_g (1 - p_g)`` (``p_g`` a group's pass rate), kept as a moving average
  (:func:`learning_potential`);
* **cross-task synergy** ``S_k``: how much an update on task ``k`` also moves the others
  the way they want to go, the mean cosine between task ``k``'s policy gradient and each
  other task's (:func:`synergy`), in ``[-1, 1]``.

``U_k = LP_k (1 + lam S_k)`` (:func:`utility`): a task with potential whose gradient
agrees with the others' is worth the most. The step's prompt budget is routed over
tasks in proportion to ``softmax(U / tau)`` above a floor that keeps every task measured
(:func:`allocate`, largest-remainder rounding), and then within a task to its most
informative prompts (the caller's second level). Each task's KL coefficient is the
base one scaled by the mean utility over the task's (:func:`kl_scales`, clipped): a task
with potential left trains under a looser constraint, a saturated one under a tighter.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def learning_potential(pass_rates: Tensor) -> Tensor:
    """The mean normalised outcome uncertainty ``4 p (1 - p)`` of groups' pass rates."""
    p = pass_rates.double()
    return (4 * p * (1 - p)).mean().float() if len(p) else torch.tensor(0.0)


def synergy(grads: Tensor) -> Tensor:
    """``[K]``: the mean cosine of each task's gradient (``grads`` ``[K, D]``) with every
    other task's (0 for a zero gradient or a single task)."""
    K = grads.shape[0]
    if K < 2:
        return torch.zeros(K)
    unit = grads.double() / grads.double().norm(dim=1, keepdim=True).clamp_min(1e-30)
    cos = unit @ unit.T
    cos.fill_diagonal_(0.0)
    return (cos.sum(1) / (K - 1)).float()


def utility(potential: Tensor, syn: Tensor, lam: float) -> Tensor:
    """``LP (1 + lam S)``, never below 0."""
    return (potential * (1 + lam * syn)).clamp_min(0.0)


def allocate(util: Tensor, n: int, tau: float, floor: float) -> list[int]:
    """``n`` prompts over the tasks: shares ``floor + (1 - K floor) softmax(U / tau)``,
    rounded by largest remainder (the counts sum to ``n``; ties to the lower index)."""
    K = len(util)
    if not 0 <= floor * K <= 1:
        raise ValueError(f"floor {floor} x {K} tasks must be in [0, 1]")
    share = floor + (1 - K * floor) * torch.softmax(util.double() / tau, 0)
    raw = share * n
    counts = [math.floor(x) for x in raw.tolist()]
    rest = (raw - torch.tensor(counts, dtype=torch.float64)).tolist()
    for i in sorted(range(K), key=lambda i: (-rest[i], i))[: n - sum(counts)]:
        counts[i] += 1
    return counts


def kl_scales(util: Tensor, lo: float, hi: float) -> Tensor:
    """Each task's multiplier of the base KL coefficient: the mean utility over the task's,
    clipped to ``[lo, hi]`` (all 1 when every utility is 0)."""
    mean = util.mean()
    if mean <= 0:
        return torch.ones_like(util)
    return (mean / util.clamp_min(mean * lo)).clamp(lo, hi)
