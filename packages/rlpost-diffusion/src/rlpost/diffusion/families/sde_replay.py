"""SDE replay with ratios (Flow-GRPO, DanceGRPO, SLAS): each sample's stored stochastic
transitions are replayed under the current policy, one loss per trained denoising step.

The plan draws the trained steps (``timestep_fraction`` of the ``T``, the same for every
sample) and a permutation of the samples. For each step, the current velocity gives the
stored transition's log-probability under the sampler (differentiable in ``v``), the
method's loss reads it beside the sampling policy's; a transition regulariser (the KL)
also gets the step's Gaussian under the reference. The loss of a sample is the mean over
its trained steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.diffusion import objectives as obj
from rlpost.diffusion.families.base import (
    Family,
    LossInput,
    Plan,
    register_family,
    regularize,
)
from rlpost.diffusion.models.base import cond_index
from rlpost.diffusion.regularizers import RegInput
from rlpost.diffusion.samplers import step


@dataclass(frozen=True)
class SDEReplayParams:
    timestep_fraction: float = 1.0  # of the denoising steps trained per sample

    def __post_init__(self) -> None:
        if not 0 < self.timestep_fraction <= 1:
            raise ValueError(f"timestep_fraction must be in (0, 1], got {self.timestep_fraction}")


def plan(tr: Any, b: Any, p: SDEReplayParams) -> Plan:
    T = tr.cfg.sampler.steps
    n_train = max(1, round(p.timestep_fraction * T))
    steps = torch.randperm(T)[:n_train].sort().values
    return Plan(torch.randperm(b.rewards.numel(), device=tr.device), {"steps": steps})


def loss(tr: Any, b: Any, plan: Plan, idx: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Summed (over samples; mean over steps) loss of samples ``idx``."""
    cond, adv, steps = cond_index(b.cond, idx), b.advantages[idx], plan.state["steps"]
    total = torch.zeros((), device=tr.device)
    sums = {r: 0.0 for r in tr.regularizer_names} | {"clip_frac": 0.0, "vnorm_ratio": 0.0}
    for j in steps.tolist():
        x, x_next = b.traj.xs[idx, j], b.traj.xs[idx, j + 1]
        sig = tr.sigmas[j].expand(len(idx))
        v = tr.policy.velocity(x, sig, cond).float()
        kw = dict(params=tr.sampler_params, sigma_max=float(tr.sigmas[1]), x_next=x_next)
        out = step(tr.sampler_name, x, v, tr.sigmas[j], tr.sigmas[j + 1], **kw)
        res = tr.method.loss(LossInput(v, adv, logprob=out.logprob,
                                       old_logprob=b.traj.logprobs[idx, j]))  # fmt: skip
        for k, m in res.metrics.items():
            sums[k] = sums.get(k, 0.0) + m
        step_loss = res.loss
        if tr.regularizers:
            inp = _reg_input(tr, x, v, sig, cond, out, (tr.sigmas[j], tr.sigmas[j + 1]), kw)
            sums["vnorm_ratio"] += (
                (obj.velocity_norm(v.detach()) / obj.velocity_norm(inp.v_ref)).mean().item()
            )
            step_loss = regularize(tr, step_loss, inp, sums)
        total = total + step_loss.sum()
    n = max(len(steps), 1)
    return total / n, {k: v / n for k, v in sums.items()}


def _reg_input(tr: Any, x: Tensor, v: Tensor, sig: Tensor, cond: Any, out: Any,
               sigmas: tuple[Tensor, Tensor], kw: dict) -> RegInput:  # fmt: skip
    """The regularisers' input at one step: the reference's velocity, and for a transition
    regulariser (the KL) the step's Gaussian under both policies."""
    v_ref = tr.policy.reference_velocity(x, sig, cond).float()
    if not any(r.transition for r, _ in tr.regularizers):
        return RegInput(v, v_ref)
    ref = step(tr.sampler_name, x, v_ref, *sigmas, **kw)
    return RegInput(v, v_ref, out.mean, ref.mean, out.std)


register_family(Family("sde_replay", plan, loss, SDEReplayParams, stochastic=True))
