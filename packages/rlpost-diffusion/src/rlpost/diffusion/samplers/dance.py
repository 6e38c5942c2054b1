"""DanceGRPO's SDE step (Xue et al. 2025, arXiv:2505.07818, eq. 6): the marginal-preserving
Euler-Maruyama step of :func:`rlpost.diffusion.sampler.sde_step` with a constant
diffusion ``s = eta``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.diffusion.sampler import StepOut
from rlpost.diffusion.samplers.base import Sampler, StepContext, register_sampler


@dataclass(frozen=True)
class DanceParams:
    eta: float = 0.3  # the noise level (DanceGRPO: 0.3)

    def __post_init__(self) -> None:
        if not self.eta > 0:
            raise ValueError(f"eta must be > 0, got {self.eta}")


def step(
    x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, p: DanceParams,
    ctx: StepContext,
) -> StepOut:  # fmt: skip
    s = torch.as_tensor(p.eta, dtype=x.dtype, device=x.device)
    return ctx.sde(x, v, sigma, sigma_next, s)


register_sampler(
    Sampler(
        name="dance",
        paper="Xue et al. 2025, DanceGRPO, arXiv:2505.07818",
        step=step,
        stochastic=True,
        params=DanceParams,
    )
)
