"""The deterministic probability-flow ODE step (diffusers' ``FlowMatchEulerDiscreteScheduler``):
``x_next = x + (sigma_next - sigma) v``; no noise, no log-probability."""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.core.registry import NoParams
from rlpost.diffusion.sampler import StepOut, ode_step
from rlpost.diffusion.samplers.base import Sampler, StepContext, register_sampler


def step(
    x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, p: NoParams,
    ctx: StepContext,
) -> StepOut:  # fmt: skip
    nxt = ode_step(x, v, sigma, sigma_next)
    return StepOut(nxt, nxt, torch.zeros((), device=x.device), None)


register_sampler(
    Sampler(name="ode", paper="Euler step of the probability-flow ODE", step=step, stochastic=False)
)
