"""Flow-GRPO's SDE step (Liu et al. 2025, arXiv:2505.05470, eq. 9 and sec. 4.2): the
marginal-preserving Euler-Maruyama step of :func:`rlpost.diffusion.sampler.sde_step` with
diffusion ``s = a sqrt(sigma / (1 - sigma))``; at ``sigma = 1`` the ratio uses the grid's
second sigma (the coefficient is infinite at pure noise)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlpost.diffusion.sampler import StepOut, flow_grpo_diffusion
from rlpost.diffusion.samplers.base import Sampler, StepContext, register_sampler


@dataclass(frozen=True)
class FlowGRPOParams:
    a: float = 0.7  # the noise level (Flow-GRPO: 0.7)

    def __post_init__(self) -> None:
        if not self.a > 0:
            raise ValueError(f"a must be > 0, got {self.a}")


def step(
    x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float,
    p: FlowGRPOParams, ctx: StepContext,
) -> StepOut:  # fmt: skip
    s = flow_grpo_diffusion(sigma, ctx.sigma_max, p.a).to(x.device)
    return ctx.sde(x, v, sigma, sigma_next, s)


register_sampler(
    Sampler(
        name="flow_grpo",
        paper="Liu et al. 2025, Flow-GRPO, arXiv:2505.05470",
        step=step,
        stochastic=True,
        params=FlowGRPOParams,
    )
)
