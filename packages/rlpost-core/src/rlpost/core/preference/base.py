"""Preference losses on chosen / rejected responses.

Signature ``fn(PreferenceInput, params) -> PreferenceOutput``. Inputs are *sequence*
log-probs ``[B]`` (sum over the response tokens): ``chosen_logp``, ``rejected_logp`` of the
policy, ``ref_chosen_logp``, ``ref_rejected_logp`` of the frozen reference (needed by DPO
and IPO), and response lengths ``chosen_len``, ``rejected_len`` ``[B]`` (needed by SimPO).
``loss`` is per pair ``[B]``; take its mean for the step.

Entries: :mod:`.classic` (``dpo``, ``ipo``, ``simpo``) and :mod:`.seed` (``xi_dpo``, catalog
001-06; ``gate_dpo``, 001-20, a gating wrapper around any other entry; ``ed_dpo``, 001-04,
ED-iDPO).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from rlpost.core.contract import Input
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
    "preference loss",
    PreferenceInput,
    PreferenceOutput,
    inputs={
        Input.REF_LOGPROBS: ("ref_chosen_logp", "ref_rejected_logp"),
        Input.LENGTHS: ("chosen_len", "rejected_len"),
    },
    gated=(Input.REF_LOGPROBS, Input.LENGTHS),
)


def _out(loss: Tensor, rc: Tensor, rr: Tensor) -> PreferenceOutput:
    rc, rr = rc.detach(), rr.detach()
    return PreferenceOutput(
        loss,
        rc,
        rr,
        {"reward_acc": (rc > rr).float().mean().item(), "margin": (rc - rr).mean().item()},
    )


def _per_token(inp: PreferenceInput, name: str) -> tuple[Tensor, Tensor]:
    """Length-normalised log-likelihoods log pi(y_w) / |y_w|, log pi(y_l) / |y_l|  [B]."""
    if inp.chosen_len is None or inp.rejected_len is None:
        raise ValueError(f"{name} needs chosen_len and rejected_len")
    return (
        inp.chosen_logp / inp.chosen_len.to(inp.chosen_logp.dtype).clamp_min(1.0),
        inp.rejected_logp / inp.rejected_len.to(inp.rejected_logp.dtype).clamp_min(1.0),
    )
