"""DPO (with cDPO label smoothing), IPO and SimPO."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from rlpost.core.contract import Input
from rlpost.core.preference.base import (
    PREFERENCE_LOSSES,
    PreferenceInput,
    PreferenceOutput,
    _out,
    _per_token,
)


@dataclass(frozen=True)
class DPOParams:
    beta: float = 0.1
    label_smoothing: float = 0.0  # conservative DPO (cDPO): assumed label-flip rate

    def __post_init__(self) -> None:
        if self.beta <= 0 or not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"need beta > 0 and 0 <= label_smoothing < 0.5, got {self}")


@PREFERENCE_LOSSES.register("dpo", DPOParams, needs={Input.REF_LOGPROBS})
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


@PREFERENCE_LOSSES.register("ipo", IPOParams, needs={Input.REF_LOGPROBS})
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


@PREFERENCE_LOSSES.register("simpo", SimPOParams, needs={Input.LENGTHS})
def simpo(inp: PreferenceInput, p: SimPOParams) -> PreferenceOutput:
    """SimPO (Meng et al. 2024, arXiv:2405.14734): reference-free, length-normalised.

    r(y) = (beta / |y|) log pi(y);  loss = -log sigmoid(r(y_w) - r(y_l) - gamma)
    """
    lc, lr = _per_token(inp, "simpo")
    rc, rr = p.beta * lc, p.beta * lr
    return _out(-F.logsigmoid(rc - rr - p.gamma), rc, rr)
