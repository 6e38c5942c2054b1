"""Preference losses on chosen / rejected responses.

Signature ``fn(PreferenceInput, params) -> PreferenceOutput``. Inputs are *sequence*
log-probs ``[B]`` (sum over the response tokens): ``chosen_logp``, ``rejected_logp`` of the
policy, ``ref_chosen_logp``, ``ref_rejected_logp`` of the frozen reference (needed by DPO
and IPO), and response lengths ``chosen_len``, ``rejected_len`` ``[B]`` (needed by SimPO).
``loss`` is per pair ``[B]``; take its mean for the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor

from rlpost.core.registry import Registry


@dataclass(frozen=True)
class PreferenceInput:
    chosen_logp: Tensor
    rejected_logp: Tensor
    ref_chosen_logp: Tensor | None = None
    ref_rejected_logp: Tensor | None = None
    chosen_len: Tensor | None = None
    rejected_len: Tensor | None = None

    def __post_init__(self) -> None:
        B = self.chosen_logp.shape
        if len(B) != 1:
            raise ValueError(f"chosen_logp must be [B] sequence log-probs, got {tuple(B)}")
        for name in (
            "rejected_logp",
            "ref_chosen_logp",
            "ref_rejected_logp",
            "chosen_len",
            "rejected_len",
        ):
            t = getattr(self, name)
            if t is not None and t.shape != B:
                raise ValueError(f"{name} shape {tuple(t.shape)} != chosen_logp {tuple(B)}")

    def ref_margin(self) -> tuple[Tensor, Tensor]:
        """(log pi/pi_ref)(chosen), (log pi/pi_ref)(rejected)."""
        if self.ref_chosen_logp is None or self.ref_rejected_logp is None:
            raise ValueError("this loss needs ref_chosen_logp and ref_rejected_logp")
        return (
            self.chosen_logp - self.ref_chosen_logp.detach(),
            self.rejected_logp - self.ref_rejected_logp.detach(),
        )


@dataclass(frozen=True)
class PreferenceOutput:
    loss: Tensor  # [B]
    chosen_reward: Tensor  # [B] detached implicit reward
    rejected_reward: Tensor  # [B] detached
    metrics: dict[str, float] = field(default_factory=dict)


PREFERENCE_LOSSES: Registry[PreferenceInput, PreferenceOutput] = Registry(
    "preference loss", PreferenceInput, PreferenceOutput
)


def _out(loss: Tensor, rc: Tensor, rr: Tensor) -> PreferenceOutput:
    rc, rr = rc.detach(), rr.detach()
    return PreferenceOutput(
        loss,
        rc,
        rr,
        {"reward_acc": (rc > rr).float().mean().item(), "margin": (rc - rr).mean().item()},
    )


@dataclass(frozen=True)
class DPOParams:
    beta: float = 0.1
    label_smoothing: float = 0.0  # conservative DPO (cDPO): assumed label-flip rate

    def __post_init__(self) -> None:
        if self.beta <= 0 or not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"need beta > 0 and 0 <= label_smoothing < 0.5, got {self}")


@PREFERENCE_LOSSES.register("dpo", DPOParams)
def dpo(inp: PreferenceInput, p: DPOParams) -> PreferenceOutput:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290).

    h = beta * [(log pi - log pi_ref)(y_w) - (log pi - log pi_ref)(y_l)]
    loss = -(1 - eps) log sigmoid(h) - eps log sigmoid(-h)   (eps = label_smoothing)
    """
    lc, lr = inp.ref_margin()
    h = p.beta * (lc - lr)
    loss = -(1 - p.label_smoothing) * F.logsigmoid(h) - p.label_smoothing * F.logsigmoid(-h)
    return _out(loss, p.beta * lc, p.beta * lr)


@dataclass(frozen=True)
class IPOParams:
    tau: float = 0.1

    def __post_init__(self) -> None:
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")


@PREFERENCE_LOSSES.register("ipo", IPOParams)
def ipo(inp: PreferenceInput, p: IPOParams) -> PreferenceOutput:
    """IPO (Azar et al. 2023, arXiv:2310.12036): squared loss to a fixed margin.

    h = (log pi - log pi_ref)(y_w) - (log pi - log pi_ref)(y_l);  loss = (h - 1/(2 tau))^2
    """
    lc, lr = inp.ref_margin()
    loss = (lc - lr - 1.0 / (2.0 * p.tau)) ** 2
    return _out(loss, lc, lr)


@dataclass(frozen=True)
class SimPOParams:
    beta: float = 2.0
    gamma: float = 1.0  # target reward margin (paper sweeps 0.5-1.6)

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


@PREFERENCE_LOSSES.register("simpo", SimPOParams)
def simpo(inp: PreferenceInput, p: SimPOParams) -> PreferenceOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734): reference-free, length-normalised.

    r(y) = (beta / |y|) log pi(y);  loss = -log sigmoid(r(y_w) - r(y_l) - gamma)
    """
    if inp.chosen_len is None or inp.rejected_len is None:
        raise ValueError("simpo needs chosen_len and rejected_len")
    rc = p.beta * inp.chosen_logp / inp.chosen_len.to(inp.chosen_logp.dtype).clamp_min(1.0)
    rr = p.beta * inp.rejected_logp / inp.rejected_len.to(inp.rejected_logp.dtype).clamp_min(1.0)
    return _out(-F.logsigmoid(rc - rr - p.gamma), rc, rr)
