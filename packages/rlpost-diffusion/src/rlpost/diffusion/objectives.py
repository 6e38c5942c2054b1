"""RL objectives for flow-matching generators, as pure tensor functions.

Two families, both built from :mod:`rlpost.core` where the math is shared:

* **SDE policy-gradient** (Flow-GRPO, DanceGRPO, SLAS): each denoising step of an SDE
  rollout is a Gaussian "action" with log-probability from :mod:`rlpost.diffusion.sampler`;
  the per-step surrogate is core's ``ppo_clip`` with the steps in the token dimension.
* **Velocity-local regression** (RAM, AWM, reward-weighted matching): the model samples a
  clean endpoint with any ODE sampler, the endpoint is scored, re-noised as in pretraining
  and the velocity regressed to a target; no SDE rollouts, log-probabilities or reward
  gradients.

:func:`normguard` composes additively with any loss computed from a velocity
``v_theta(x, sigma)`` and the reference ``v_ref(x, sigma)`` at the same inputs.

The advantages (group-normalised, SLAS, reward-weighted) are core ``ADVANTAGES`` entries
(``grpo`` with ``clip``, ``slas``, ``reward_weighted``). Every function takes and returns
per-sample tensors (``[B]`` losses) so the trainer chooses the reduction; shapes of images are ``[B, C, H, W]`` (any trailing dims work).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlpost.core.objectives import OBJECTIVES, ObjectiveInput

# ---------------------------------------------------------------------- SDE policy loss


def sde_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_range: float = 1e-4,
) -> tuple[Tensor, dict[str, float]]:
    """Flow-GRPO's per-step clipped surrogate, via core ``ppo_clip``.

    ``logp``, ``old_logp``: ``[B, S]`` log-probabilities of the stored transitions of ``S``
    denoising steps under the current and the sampling policy; ``advantages`` ``[B]``
    (shared by every step of a sample). Returns the per-sample loss ``[B]`` (mean over the
    steps) and the objective's metrics.
    """
    obj = OBJECTIVES.build("ppo_clip", clip_low=clip_range, clip_high=clip_range)
    out = obj(ObjectiveInput(logp, old_logp, advantages, torch.ones_like(logp)))
    return out.loss.mean(1), out.metrics


def step_mean_kl(mean: Tensor, mean_ref: Tensor, std: Tensor) -> Tensor:
    """KL between the policy's and the reference's step Gaussians (same std), per sample.

    ``KL(N(mu, s^2) || N(mu_ref, s^2)) = ||mu - mu_ref||^2 / (2 s^2)`` per element, averaged
    over the elements like the log-probability (Flow-GRPO's KL on the step means).
    """
    return ((mean - mean_ref) ** 2 / (2 * std**2)).flatten(1).mean(1)


# ------------------------------------------------------------- velocity-local objectives


def sample_sigmas(
    n: int,
    dist: Literal["logit_normal", "uniform"] = "logit_normal",
    loc: float = 0.0,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Noise levels for re-noising "as in pretraining": SD3's logit-normal
    ``sigma = sigmoid(N(loc, scale^2))`` (Esser et al. 2024) or uniform on (0, 1)."""
    if dist == "logit_normal":
        z = torch.randn(n, generator=generator, device=device) * scale + loc
        return torch.sigmoid(z)
    if dist == "uniform":
        return torch.rand(n, generator=generator, device=device).clamp(1e-4, 1 - 1e-4)
    raise ValueError(f"sigma distribution must be 'logit_normal' or 'uniform', got {dist!r}")


def renoise(x0: Tensor, sigma: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
    """The pretraining forward process: ``x_sigma = (1 - sigma) x0 + sigma eps`` and the
    conditional velocity target ``u = eps - x0``."""
    s = sigma.reshape(-1, *([1] * (x0.dim() - 1)))
    return (1 - s) * x0 + s * eps, eps - x0


def ram_target(v_ref: Tensor, v_old: Tensor, u: Tensor, advantages: Tensor, m: float) -> Tensor:
    """Reinforce Adjoint Matching target (RAM, catalog 001-01).

    ``target = v_ref(x, sigma) + m A (u - v_old(x, sigma))`` with ``u = eps - x0``.

    Under KL-regularised reward maximisation the optimal process tilts the clean-endpoint
    law by ``exp(r / lambda)`` and keeps the noising law, so the optimal velocity is the
    reference's plus the reward-covariance of the conditional target given ``x_sigma``;
    the REINFORCE identity estimates that covariance from the model's own samples as
    ``A (u - v_old)`` (``v_old``, the sampling model's velocity, is the baseline that makes
    it zero-mean). ``m`` is the strength (1 / lambda, the KL knob). ``A = 0`` everywhere
    regresses to the reference: pretraining's target.
    """
    a = advantages.reshape(-1, *([1] * (u.dim() - 1)))
    return v_ref + m * a * (u - v_old)


def regression_loss(v: Tensor, target: Tensor) -> Tensor:
    """``||v - target||^2`` averaged over a sample's elements: ``[B]``."""
    return ((v - target.detach()) ** 2).flatten(1).mean(1)


def awm_loss(v: Tensor, u: Tensor, advantages: Tensor) -> Tensor:
    """Advantage-weighted matching (AWM): the pretraining loss weighted by the advantage.

    ``loss = A ||v - u||^2`` on the model's own samples: minimising it pulls ``v`` toward
    the conditional target ``u = eps - x0`` of samples with positive advantage and pushes
    it away from those with negative advantage (a policy gradient whose log-likelihood
    surrogate is the flow-matching error). Pair it with NormGuard or a KL to the reference.
    """
    return advantages.detach() * regression_loss(v, u)


# -------------------------------------------------------------------------- NormGuard

NORMGUARD_FORMS = ("hinge", "squared_hinge", "relative")


def velocity_norm(v: Tensor) -> Tensor:
    return v.flatten(1).norm(dim=1)


def normguard(
    v: Tensor,
    v_ref: Tensor,
    form: Literal["hinge", "squared_hinge", "relative"] = "hinge",
    margin: float = 0.0,
) -> Tensor:
    """NormGuard (catalog 004-28): penalise the velocity norm only above the reference's.

    ``hinge``: ``max(0, ||v|| - (1 + margin) ||v_ref||)`` (the abstract's form);
    ``squared_hinge``: its square; ``relative``: ``max(0, ||v|| / ||v_ref|| - 1 - margin)``
    (scale-free across resolutions). Norms are per sample over all elements, ``[B]``.

    The gradient is zero wherever ``||v|| <= ||v_ref||`` and otherwise points along
    ``v / ||v||``: it shrinks the magnitude without turning the direction, so it adds to
    any velocity-local loss without changing what that loss asks of the direction.
    """
    n, n_ref = velocity_norm(v), velocity_norm(v_ref.detach())
    if form == "hinge":
        return torch.relu(n - (1 + margin) * n_ref)
    if form == "squared_hinge":
        return torch.relu(n - (1 + margin) * n_ref) ** 2
    if form == "relative":
        return torch.relu(n / n_ref.clamp_min(1e-12) - 1 - margin)
    raise ValueError(f"NormGuard form must be one of {NORMGUARD_FORMS}, got {form!r}")
