"""Samplers for rectified-flow models: the deterministic ODE step and the two SDE steps
that GRPO-style methods need for a per-step Gaussian log-probability.

Convention (SD3, diffusers' ``FlowMatchEulerDiscreteScheduler``): the forward process is
``x_sigma = (1 - sigma) x0 + sigma eps`` with ``sigma`` from 1 (noise) to 0 (data), and the
model predicts the velocity ``v = dx/dsigma = eps - x0``. Sampling integrates from
``sigma_0 = 1`` down to ``sigma_T = 0`` over the scheduler's (shifted) sigma grid, so
every step has ``d_sigma = sigma_next - sigma < 0``.

The ODE and both SDEs share the marginals ``p_sigma`` of the forward process; the SDEs add
noise with diffusion coefficient ``s(sigma)`` and correct the drift with the score
``grad log p_sigma(x) = -(x + (1 - sigma) v) / sigma`` (eq. 3 below), which for a rectified
flow follows from ``eps_hat = x + (1 - sigma) v``. Writing the reverse-time SDE
``dx = [v - (s^2 / 2) score] d_sigma + s dW`` and taking one Euler-Maruyama step:

1. ``d_sigma = sigma_next - sigma``                                   (negative)
2. ``score = -(x + (1 - sigma) v) / sigma``                            (eq. 3)
3. ``mean = x + [v - (s^2 / 2) score] d_sigma``
   ``     = x + [v + s^2 / (2 sigma) (x + (1 - sigma) v)] d_sigma``
4. ``std = s sqrt(-d_sigma)``;  ``x_next = mean + std * z``,  ``z ~ N(0, I)``
5. ``log p(x_next | x) = log N(x_next; mean, std^2 I)``, averaged over the sample's
   elements (Flow-GRPO's reduction; ``reduce="sum"`` gives the exact joint density).

* **Flow-GRPO** (Liu et al. 2025, arXiv:2505.05470, eq. 9 and sec. 4.2):
  ``s = a sqrt(sigma / (1 - sigma))`` with ``a = 0.7``; at ``sigma = 1`` the ratio uses
  the grid's second sigma (the coefficient is infinite at pure noise).
* **DanceGRPO** (Xue et al. 2025, arXiv:2505.07818, eq. 6): constant ``s = eta = 0.3``,
  the score written as ``-(x - (1 - sigma) x0_hat) / sigma^2`` with
  ``x0_hat = x - sigma v`` (the same quantity as step 2).
* **ODE** (``FlowMatchEulerDiscreteScheduler.step``): ``x_next = x + d_sigma v`` (s = 0).

This module is the shared math; each sampler is a registered entry of
:data:`rlpost.diffusion.samplers.SAMPLERS` (one module each), and
:func:`rlpost.diffusion.samplers.sample` integrates a trajectory with one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def flow_sigmas(num_steps: int, shift: float = 1.0) -> Tensor:
    """The ``num_steps + 1`` sigmas (1 -> 0) of diffusers' ``FlowMatchEulerDiscreteScheduler``.

    ``shift`` is SD3's timestep shift ``sigma' = shift s / (1 + (shift - 1) s)`` (3.0 for
    SD3 at 1024 px, 1.0 for the toy model).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(num_steps)
    return sched.sigmas.to(torch.float32)


def _col(s: Tensor | float, like: Tensor) -> Tensor:
    """A scalar or ``[B]`` sigma as a tensor broadcastable against ``like`` ``[B, ...]``."""
    s = torch.as_tensor(s, dtype=like.dtype, device=like.device)
    return s.reshape(-1, *([1] * (like.dim() - 1))) if s.dim() else s


def gaussian_logprob(x: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean") -> Tensor:
    """``log N(x; mean, std^2)`` per element, reduced over all but the batch dimension."""
    lp = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    lp = lp.flatten(1)
    return lp.mean(1) if reduce == "mean" else lp.sum(1)


@dataclass(frozen=True)
class StepOut:
    x_next: Tensor  # [B, ...]
    mean: Tensor  # [B, ...] the step's Gaussian mean (x_next for the ODE)
    std: Tensor  # broadcastable std of the step (0 for the ODE)
    logprob: Tensor | None  # [B] log p(x_next | x) (None for the ODE)


def ode_step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float) -> Tensor:
    """Euler step of the probability-flow ODE: ``x + (sigma_next - sigma) v``."""
    return x + (_col(sigma_next, x) - _col(sigma, x)) * v


def sde_step(
    x: Tensor,
    v: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    diffusion: Tensor | float,
    *,
    noise: Tensor | None = None,
    x_next: Tensor | None = None,
    generator: torch.Generator | None = None,
    reduce: str = "mean",
) -> StepOut:
    """One Euler-Maruyama step of the marginal-preserving SDE (steps 1-5 of the module doc).

    ``diffusion`` is ``s(sigma)``. Pass ``x_next`` to score a stored transition (training:
    the log-probability is then differentiable in ``v``), else it is sampled from ``noise``
    (or fresh Gaussian noise).
    """
    sig, sig_next = _col(sigma, x), _col(sigma_next, x)
    s = _col(diffusion, x)
    d_sigma = sig_next - sig  # 1.
    drift = v + s**2 / (2 * sig) * (x + (1 - sig) * v)  # 2.-3.: v - (s^2 / 2) score
    mean = x + drift * d_sigma
    std = s * torch.sqrt(-d_sigma)  # 4.
    if x_next is None:
        if noise is None:
            noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x_next = mean + std * noise
    return StepOut(x_next, mean, std, gaussian_logprob(x_next.detach(), mean, std, reduce))  # 5.


def flow_grpo_diffusion(sigma: Tensor | float, sigma_max: float, a: float = 0.7) -> Tensor:
    """Flow-GRPO's ``s = a sqrt(sigma / (1 - sigma))``; ``sigma = 1`` uses ``sigma_max``."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    denom = torch.where(sigma >= 1, torch.full_like(sigma, sigma_max), sigma)
    return a * torch.sqrt(sigma / (1 - denom))
