"""Re-noised velocity regression (RAM, AWM, RWR): the clean endpoints of the (ODE)
samples are re-noised as in pretraining, ``x = (1 - sigma) x0 + sigma eps`` with target
``u = eps - x0``, and the method regresses the velocity there.

The plan repeats each endpoint ``renoise_k`` times and draws every row's noise level
(``sigma_dist``: logit-normal or uniform) and noise before any update, so all minibatches
of a step share them; for a method that reads the sampling model's velocity
(``Input.SAMPLING_VELOCITY``) with several minibatches, it also evaluates that velocity
there (with one minibatch, the current velocity detached is the same). The reference's
velocity is evaluated when the method reads it (``Input.REF_VELOCITY``) or a regulariser
is active.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from rlpost.core.contract import Input
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


@dataclass(frozen=True)
class RenoiseParams:
    renoise_k: int = 4  # re-noisings of each clean endpoint per step
    sigma_dist: Literal["logit_normal", "uniform"] = "logit_normal"
    sigma_loc: float = 0.0
    sigma_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.renoise_k < 1 or not self.sigma_scale > 0:
            raise ValueError(f"need renoise_k >= 1 and sigma_scale > 0, got {self}")


def plan(tr: Any, b: Any, p: RenoiseParams) -> Plan:
    B = b.rewards.numel()
    rows = torch.arange(B, device=tr.device).repeat_interleave(p.renoise_k)
    x0 = b.traj.x0[rows]
    sig = obj.sample_sigmas(len(rows), p.sigma_dist, p.sigma_loc, p.sigma_scale,
                            device=tr.device)  # fmt: skip
    state = {"rows": rows, "sigma": sig, "eps": torch.randn_like(x0)}
    if Input.SAMPLING_VELOCITY in tr.method.method.needs and tr.cfg.optim.minibatches > 1:
        with torch.no_grad():
            olds = []
            for mb in torch.arange(len(rows), device=tr.device).split(
                tr.cfg.optim.micro_batch_size
            ):
                xs, _ = obj.renoise(x0[mb], sig[mb], state["eps"][mb])
                olds.append(tr.policy.velocity(xs, sig[mb], cond_index(b.cond, rows[mb])))
            state["v_old"] = torch.cat(olds).float()
    return Plan(torch.randperm(len(rows), device=tr.device), state)


def loss(tr: Any, b: Any, plan: Plan, j: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Summed loss of the re-noised rows ``j`` of the plan."""
    st = plan.state
    idx = st["rows"][j]
    cond, adv, sig = cond_index(b.cond, idx), b.advantages[idx], st["sigma"][j]
    xs, u = obj.renoise(b.traj.x0[idx], sig, st["eps"][j])
    v = tr.policy.velocity(xs, sig, cond).float()
    needs = tr.method.method.needs
    need_ref = Input.REF_VELOCITY in needs or bool(tr.regularizers)
    v_ref = tr.policy.reference_velocity(xs, sig, cond).float() if need_ref else None
    v_old = None
    if Input.SAMPLING_VELOCITY in needs:
        v_old = st["v_old"][j] if "v_old" in st else v.detach()
    res = tr.method.loss(LossInput(v, adv, target=u, v_old=v_old,
                                   v_ref=v_ref if Input.REF_VELOCITY in needs else None))  # fmt: skip
    metrics: dict[str, float] = dict(res.metrics)
    if v_ref is not None:
        ratio = obj.velocity_norm(v.detach()) / obj.velocity_norm(v_ref)
        metrics["vnorm_ratio"] = ratio.mean().item()
    out = regularize(tr, res.loss, RegInput(v, v_ref), metrics) if tr.regularizers else res.loss
    return out.sum(), metrics


register_family(Family("renoise", plan, loss, RenoiseParams, stochastic=False))
