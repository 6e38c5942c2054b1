"""The sampler registry of the diffusion trainer: ``SAMPLERS``.

A :class:`Sampler` is one way to take a denoising step of a rectified flow, in the manner
of diffusers' schedulers: ``step(x, v, sigma, sigma_next, params, ctx) -> StepOut`` gives
the next state and, for a stochastic sampler, the step's Gaussian mean, standard
deviation and the log-probability of the next state (:mod:`rlpost.diffusion.sampler`
holds the shared math). ``params`` is the sampler's own frozen dataclass (a method names
its sampler and their values as a :class:`~rlpost.core.presets.Choice`; the run's
``sampler.params`` override them), and ``ctx`` what every sampler receives alike
(:class:`StepContext`).

Adding a sampler is one module with its step and one :func:`register_sampler` call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.registry import NoParams, ParamsRegistry
from rlpost.diffusion.models.base import Cond
from rlpost.diffusion.sampler import StepOut, flow_sigmas, sde_step


@dataclass(frozen=True)
class StepContext:
    """What a step receives beside ``(x, v, sigma, sigma_next)`` and its parameters.

    * ``sigma_max``: the grid's largest sigma below 1 (Flow-GRPO's coefficient is infinite
      at pure noise and uses it there);
    * ``noise``: the step's standard normal draw (else fresh from ``generator``);
    * ``x_next``: a stored next state to score instead of sampling one (training: the
      log-probability is then differentiable in ``v``);
    * ``reduce``: the log-probability's reduction over a sample's elements (``mean``,
      Flow-GRPO's; ``sum``: the exact joint density).
    """

    sigma_max: float = 1.0
    noise: Tensor | None = None
    x_next: Tensor | None = None
    generator: torch.Generator | None = None
    reduce: str = "mean"

    def sde(self, x: Tensor, v: Tensor, sigma: Any, sigma_next: Any, s: Tensor) -> StepOut:
        """The marginal-preserving SDE step with diffusion ``s`` under this context."""
        return sde_step(x, v, sigma, sigma_next, s, noise=self.noise, x_next=self.x_next,
                        generator=self.generator, reduce=self.reduce)  # fmt: skip


StepFn = Callable[[Tensor, Tensor, Tensor | float, Tensor | float, Any, StepContext], StepOut]


@dataclass(frozen=True)
class Sampler:
    name: str
    paper: str
    step: StepFn
    stochastic: bool  # its steps carry a log-probability (a policy to train with ratios)
    params: type = NoParams


class SamplerRegistry(ParamsRegistry[Sampler]):
    """``name -> Sampler``; registering a name twice raises, an unknown name lists the
    valid ones, parameters are validated like a core registry's."""

    def __init__(self) -> None:
        super().__init__("diffusion sampler")


SAMPLERS = SamplerRegistry()


def register_sampler(sampler: Sampler) -> Sampler:
    """Register ``sampler`` in :data:`SAMPLERS` (see the module docstring)."""
    return SAMPLERS.register(sampler)


def step(
    kind: str,
    x: Tensor,
    v: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    params: Any = None,
    sigma_max: float = 1.0,
    noise: Tensor | None = None,
    x_next: Tensor | None = None,
    generator: torch.Generator | None = None,
    reduce: str = "mean",
) -> StepOut:
    """One step of the registered sampler ``kind`` with its ``params`` (its defaults when
    None)."""
    s = SAMPLERS.get(kind)
    p = params if params is not None else s.params()
    ctx = StepContext(sigma_max, noise, x_next, generator, reduce)
    return s.step(x, v, sigma, sigma_next, p, ctx)


@dataclass
class Trajectory:
    """A batch of sampled trajectories over the grid ``sigmas``."""

    xs: Tensor  # [B, T + 1, ...] states at sigmas[0] = 1 ... sigmas[T] = 0
    sigmas: Tensor  # [T + 1]
    logprobs: Tensor | None  # [B, T] log p(x_{t+1} | x_t) under the sampling policy
    velocity_norm_ratio: Tensor | None = None  # [B, T] ||v_theta|| / ||v_ref|| per step

    @property
    def x0(self) -> Tensor:
        return self.xs[:, -1]


VelocityFn = Callable[[Tensor, Tensor, Cond], Tensor]


@torch.no_grad()
def sample(
    velocity: VelocityFn,
    cond: Cond,
    shape: tuple[int, ...],
    *,
    kind: str = "ode",
    params: Any = None,
    num_steps: int = 10,
    shift: float = 1.0,
    init_noise: Tensor | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    reference: VelocityFn | None = None,
    reduce: str = "mean",
) -> Trajectory:
    """Integrate from noise to data with ``velocity`` and the registered sampler ``kind``
    (its ``params``, defaults when None), and record the trajectory.

    ``init_noise`` ``[B, *shape]`` fixes x at sigma = 1 (DanceGRPO shares it within a
    group). With ``reference``, the per-step velocity-norm ratio ``||v|| / ||v_ref||``
    along this trajectory is recorded too (NormGuard's diagnostic).
    """
    batch = next(iter(cond.values())).shape[0]
    sigmas = flow_sigmas(num_steps, shift).to(device)
    if init_noise is None:
        init_noise = torch.randn((batch, *shape), generator=generator, device=device)
    x = init_noise.to(device=device, dtype=torch.float32)
    xs, lps, ratios = [x], [], []
    for i in range(num_steps):
        sig = sigmas[i].expand(batch)
        v = velocity(x, sig, cond).float()
        if reference is not None:
            v_ref = reference(x, sig, cond).float()
            ratios.append(v.flatten(1).norm(dim=1) / v_ref.flatten(1).norm(dim=1).clamp_min(1e-12))
        out = step(
            kind,
            x,
            v,
            sigmas[i],
            sigmas[i + 1],
            params=params,
            sigma_max=float(sigmas[1]) if num_steps > 1 else 1.0,
            generator=generator,
            reduce=reduce,
        )
        x = out.x_next
        xs.append(x)
        if out.logprob is not None:
            lps.append(out.logprob)
    return Trajectory(
        xs=torch.stack(xs, 1),
        sigmas=sigmas,
        logprobs=torch.stack(lps, 1) if lps else None,
        velocity_norm_ratio=torch.stack(ratios, 1) if ratios else None,
    )
