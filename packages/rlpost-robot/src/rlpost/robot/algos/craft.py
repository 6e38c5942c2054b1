"""CRAFT: counterfactual proxy + grounded residual policy gradients (catalog 001-19).

Closed-loop RL fine-tuning has grounded but sparse feedback; counterfactual fine-tuning
(scoring candidate futures with an imperfect estimate) has dense but biased feedback.
CRAFT writes the real closed-loop policy gradient, under the same visited states, as

    grad J = E[grad log pi(a|s) A_real(s, a)]
           = E[grad log pi(a|s) A_proxy(s, a)]                      (dense proxy)
           + E[grad log pi(a|s) (A_real(s, a) - A_proxy(s, a))]     (grounded residual)

* **Proxy**: for each visited state, ``G`` candidate actions scored by the counterfactual
  estimate; their group-normalised scores are the proxy advantages of *all* candidates
  (:func:`counterfactual_advantages`) — many low-variance terms per state.
* **Residual**: for the executed action only, the grounded advantage from the real
  closed-loop outcome minus the proxy's advantage of that action
  (:func:`grounded_residual`); it removes the proxy's bias and has small variance when the
  proxy is aligned with reality. ``event_mask`` restricts it to interaction-critical
  events (where grounded feedback exists).
* **Stability**: the policy is pulled toward an EMA teacher by an asymmetric KL
  (:func:`asymmetric_kl`): ``KL(teacher || student)`` by default (mass-covering: the student
  keeps every action the teacher supports), optionally weighted more on one side.

The functions take log-probabilities so they serve discrete (vocabulary-scoring
planners) and continuous (Gaussian) policies alike.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn


def counterfactual_advantages(scores: Tensor, eps: float = 1e-6) -> Tensor:
    """Group-normalised counterfactual advantages: ``scores [B, G]`` of ``G`` candidate
    actions per state -> ``(s - mean_G) / (std_G + eps)``. Equal scores give 0 (no NaN)."""
    mean = scores.mean(1, keepdim=True)
    std = scores.std(1, keepdim=True, unbiased=False)
    return (scores - mean) / (std + eps)


def grounded_residual(
    real_advantage: Tensor, proxy_of_executed: Tensor, event_mask: Tensor | None = None
) -> Tensor:
    """``A_real - A_proxy`` of the executed action ``[B]``; 0 outside ``event_mask``."""
    res = real_advantage - proxy_of_executed
    return res if event_mask is None else res * event_mask.to(res.dtype)


def craft_surrogate(
    cand_logp: Tensor,
    proxy_adv: Tensor,
    exec_logp: Tensor,
    residual: Tensor,
    residual_coef: float = 1.0,
) -> Tensor:
    """Loss whose gradient is ``-(proxy term + residual_coef * residual term)``.

    ``cand_logp [B, G]``: log-probs of the candidates (the proxy term is the expectation
    over candidates drawn from the policy, so it is averaged over ``G``);
    ``exec_logp [B]``: log-prob of the executed action. Advantages are detached.
    """
    proxy = (cand_logp * proxy_adv.detach()).mean(1)
    grounded = exec_logp * residual.detach()
    return -(proxy + residual_coef * grounded).mean()


def asymmetric_kl(
    student_logp: Tensor,
    teacher_logp: Tensor,
    forward_weight: float = 1.0,
    reverse_weight: float = 0.0,
) -> Tensor:
    """``forward_weight KL(teacher || student) + reverse_weight KL(student || teacher)`` over
    the last (action) dimension of full log-probability tables ``[..., A]``; mean over the
    rest. The teacher is detached."""
    t = teacher_logp.detach()
    fwd = (t.exp() * (t - student_logp)).sum(-1)
    rev = (student_logp.exp() * (student_logp - t)).sum(-1)
    return (forward_weight * fwd + reverse_weight * rev).mean()


class EMATeacher:
    """``theta_teacher <- decay theta_teacher + (1 - decay) theta_student`` after each step."""

    def __init__(self, student: nn.Module, decay: float = 0.99):
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(student).requires_grad_(False).eval()

    @torch.no_grad()
    def update(self, student: nn.Module) -> None:
        for t, s in zip(self.model.parameters(), student.parameters(), strict=True):
            t.lerp_(s, 1 - self.decay)
