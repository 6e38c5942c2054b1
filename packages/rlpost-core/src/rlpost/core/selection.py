"""Learning-Zone Energy (catalog 000-18): which prompts a step's gradient goes to.

Group-relative updates teach most on prompts the policy solves sometimes: a group's
advantage magnitude grows with its reward spread, ``sqrt(p (1 - p))`` for a pass rate ``p``.
LZE scores every prompt of a finite training set with three signals fused into one
scalar, the *energy*:

* **difficulty anchor** ``p0``: the probability the initial policy gives the reference
  answer (one teacher-forced forward at the start, never updated): the prompt's prior
  pass rate, from which its pass-rate estimate starts;
* **normalised outcome uncertainty** ``4 p (1 - p)`` (1 at ``p = 1/2``, 0 when always
  right or always wrong), ``p`` the pass rate's exponential moving average,
  ``p <- beta p + (1 - beta) x observed``, started at the anchor;
* **pass-rate momentum** ``m = max(0, p - p_before)``, the visit's rise of the estimate:
  a prompt the policy is learning now is amplified, a stagnating (or forgotten) one is
  neither amplified nor penalised.

``E = 4 p (1 - p) (1 + alpha m)``. The backward selector keeps the highest-energy share of
each step's groups for the update (Gumbel-perturbed, :func:`select_top`); the forward
pruner stops generating rollouts for a prompt solved in every sample of ``patience``
consecutive visits, and replays a share of the pruned prompts each epoch, restoring
any that is no longer solved (:func:`pruner_step`).

Every function here is pure tensor math on per-prompt vectors; the stateful pool is
``rlpost.llm.rollout.sources.lze``.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-6


def anchor_pass_rate(answer_logprob: Tensor) -> Tensor:
    """The prior pass rate of each prompt: ``exp`` of the summed log-probability the initial
    policy gives its reference answer (the chance it samples that answer at temperature
    1), clamped into ``[EPS, 1 - EPS]`` so that the estimate can move both ways."""
    return answer_logprob.double().exp().clamp(EPS, 1 - EPS).float()


def ema(p: Tensor, observed: Tensor, beta: float) -> Tensor:
    """The pass-rate estimate after a visit that observed pass rate ``observed``."""
    return beta * p + (1 - beta) * observed


def energy(p: Tensor, p_before: Tensor, alpha: float) -> Tensor:
    """``4 p (1 - p) (1 + alpha max(0, p - p_before))``: the normalised outcome uncertainty
    of the current estimate, amplified by the visit's rise in pass rate."""
    return 4 * p * (1 - p) * (1 + alpha * (p - p_before).clamp(min=0))


def select_top(scores: Tensor, k: int, tau: float, generator: torch.Generator | None) -> Tensor:
    """The ``k`` indices of the highest ``log(score) + tau g`` (``g`` standard Gumbel noise;
    ``tau = 0``: the top ``k`` scores, ties to the lower index; ``tau = 1``: ``k`` draws
    without replacement in proportion to the scores), in increasing index order."""
    keys = scores.double().clamp(min=1e-30).log()
    if tau > 0:
        u = torch.rand(scores.shape, generator=generator, dtype=torch.float64)
        keys = keys - tau * torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-12)))
    order = torch.argsort(keys, descending=True, stable=True)
    return order[:k].sort().values


def pruner_step(
    streak: Tensor, pruned: Tensor, solved: Tensor, patience: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward pruner after a visit of some prompts: ``streak`` (consecutive visits
    solved in every sample), ``pruned`` and ``solved`` (this visit) are per visited
    prompt. A prompt whose streak reaches ``patience`` is pruned; a pruned prompt (being
    replayed) that is not solved any more is restored. Returns ``(streak, pruned,
    restored)``."""
    streak = torch.where(solved, streak + 1, torch.zeros_like(streak))
    restored = pruned & ~solved
    pruned = (pruned & solved) | (streak >= patience)
    return streak, pruned, restored
