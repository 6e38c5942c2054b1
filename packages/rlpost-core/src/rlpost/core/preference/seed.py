"""Seed preference losses: xi-DPO (001-06), Gate-DPO (001-20), ED-iDPO (001-04)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.preference.base import (
    PREFERENCE_LOSSES,
    PreferenceInput,
    PreferenceOutput,
    _out,
    _per_token,
)
from rlpost.core.preference.classic import DPOParams, dpo
from rlpost.core.registry import Bound

# floor of the rejected per-token NLL |l_l| in rho's denominator (nats per token): a
# rejected response with NLL below it (per-token probability > 0.99) is scored as if at
# 0.01, so rho and its gradient stay bounded (|d rho / d l_w| <= 100; at 1e-6 a near-
# certain rejected response gave gradients of ~1e9)
_RHO_FLOOR = 1e-2


def _ratio_margin(l_w: Tensor, l_l: Tensor) -> Tensor:
    """rho = 1 - l_w / l_l = (l_w - l_l) / |l_l| for per-token log-likelihoods l <= 0,
    with |l_l| floored at :data:`_RHO_FLOOR` = 0.01 nats per token."""
    return 1.0 - l_w / l_l.clamp(max=-_RHO_FLOOR)


def xi_from_initial(
    chosen_logp: Tensor,
    rejected_logp: Tensor,
    chosen_len: Tensor,
    rejected_len: Tensor,
    quantile: float = 0.9,
    bounds: tuple[float, float] = (0.05, 0.95),
) -> float:
    """xi-DPO's margin from the *initial* model's ratio margins over the data set.

    ``xi = clip(Q_quantile(rho_0), *bounds)`` with ``rho_0 = 1 - l_w / l_l`` of the initial
    policy (per-token log-likelihoods, all pairs ``[N]``). Our reading of "xi can be
    determined from the initial reward gap distribution": the target separation is the one
    the best ``1 - quantile`` of the pairs already reach before training. ``bounds`` keeps xi
    inside (0, 1), where the loss is defined.
    """
    lo, hi = bounds
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if not 0 < lo <= hi < 1:
        raise ValueError(f"bounds must satisfy 0 < lo <= hi < 1, got {bounds}")
    with torch.no_grad():
        l_w, l_l = _per_token(
            PreferenceInput(
                chosen_logp, rejected_logp, chosen_len=chosen_len, rejected_len=rejected_len
            ),
            "xi_from_initial",
        )
        rho = _ratio_margin(l_w.double(), l_l.double())
        return float(torch.quantile(rho, quantile).clamp(lo, hi))


@dataclass(frozen=True)
class XiDPOParams:
    xi: float = 0.2  # ratio reward margin in (0, 1); see xi_from_initial
    beta: float = 2.0  # cancels in rho; kept so that SimPO configs drop in

    def __post_init__(self) -> None:
        if not 0 < self.xi < 1:
            raise ValueError(f"xi must be in (0, 1) (rho < 1 always), got {self.xi}")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


@PREFERENCE_LOSSES.register("xi_dpo", XiDPOParams, needs={Input.LENGTHS})
def xi_dpo(inp: PreferenceInput, p: XiDPOParams) -> PreferenceOutput:
    """xi-DPO (catalog 001-06): reference-free, squared distance to a ratio reward margin.

    r(y) = beta * log pi(y) / |y|                     (SimPO's reward, <= 0)
    rho  = 1 - r(y_w) / r(y_l) = (l_w - l_l) / |l_l|  (l = log pi(y) / |y|; beta cancels)
    loss = (rho - xi)^2

    rho < 1 always, and rho > 0 iff the chosen response has the higher per-token
    likelihood; rho = xi means the chosen's per-token NLL is (1 - xi) times the
    rejected's. The abstract fixes the ratio form, the cancellation of beta, a bounded
    margin and "minimise the distance between reward gaps and optimal margins"; the
    per-token rewards and the *squared* distance are our reading. The loss is two-sided:
    pairs separated by more than xi are pulled back, as IPO pulls back past its target.
    ``beta`` only scales the reported rewards. ``xi_from_initial`` sets xi from the
    initial model. The rejected per-token log-prob is clamped at -0.01 nats per token:
    below that NLL (a near-certain rejected response) rho is computed at the floor, its
    gradient into the rejected log-prob is 0 and the one into the chosen is bounded by
    2 (|rho| + xi) / 0.01 per token, instead of growing like 1 / l_l^2.
    """
    l_w, l_l = _per_token(inp, "xi_dpo")
    rho = _ratio_margin(l_w, l_l)
    out = _out((rho - p.xi) ** 2, p.beta * l_w, p.beta * l_l)
    return dataclasses.replace(out, metrics={**out.metrics, "rho": rho.detach().mean().item()})


_GATE = "gate_dpo"


@dataclass(frozen=True)
class GateDPOParams:
    base: str = "dpo"  # any other PREFERENCE_LOSSES entry
    base_params: Mapping[str, Any] = field(default_factory=dict)
    valley_logp: float = -3.0  # per-token log-prob of a rejected response below which it is gated
    temperature: float = 1.0  # nats per token over which the gate falls e-fold below the valley
    floor: float = 0.0  # smallest gate

    def __post_init__(self) -> None:
        if self.base == _GATE:
            raise ValueError(f"{_GATE} cannot wrap itself; choose another base loss")
        if self.temperature <= 0 or not 0 <= self.floor <= 1 or not self.valley_logp <= 0:
            raise ValueError(
                f"need temperature > 0, 0 <= floor <= 1 and valley_logp <= 0, got {self}"
            )
        self.base_loss()  # a bad base name or base parameter fails here, at load time

    def base_loss(self) -> Bound:
        return PREFERENCE_LOSSES.build(self.base, **self.base_params)


def _gate_needs(p: GateDPOParams) -> frozenset[Input]:
    """Whatever the wrapped base loss needs."""
    return p.base_loss().needs


def _gate_reads(p: GateDPOParams) -> frozenset[Input]:
    """The base loss's inputs, and the rejected lengths (per-token geometry) when present."""
    return p.base_loss().reads | {Input.LENGTHS}


@PREFERENCE_LOSSES.register(_GATE, GateDPOParams, needs=_gate_needs, reads=_gate_reads)
def gate_dpo(inp: PreferenceInput, p: GateDPOParams) -> PreferenceOutput:
    """Gate-DPO (catalog 001-20): gate each rejected response's gradient, any base loss.

    l    = log pi(y_l) / |y_l|   (detached; the sequence log-prob when lengths are absent)
    g    = 1                                            if l >= valley_logp
         = max(floor, exp((l - valley_logp) / temperature))   otherwise  (continuous at l = valley)
    log pi(y_l) -> sg(log pi(y_l)) + g * (log pi(y_l) - sg(log pi(y_l)))
    loss = base(...)   (value unchanged; d loss / d log pi(y_l) multiplied by g)

    The abstract fixes the mechanism (the current probability geometry of each rejected
    response selectively attenuates its contribution, objective-agnostic); the per-token
    log-prob as the geometry, the threshold and the exponential decay are our reading.
    Chosen gradients and loss values are the base's exactly. Without ``rejected_len``
    the threshold applies to the sequence log-prob, so set ``valley_logp`` accordingly.
    Metrics add ``gated_frac`` (pairs with g < 1) and ``gate_mean``.
    """
    rej = inp.rejected_logp
    geo = rej.detach()  # the rejected response's "geometry": its (per-token) log-prob
    if inp.rejected_len is not None:
        geo = geo / inp.rejected_len.to(geo.dtype).clamp_min(1.0)
    below = geo < p.valley_logp
    decay = torch.exp(((geo - p.valley_logp) / p.temperature).clamp(max=0.0)).clamp_min(p.floor)
    g = torch.where(below, decay, torch.ones_like(decay))
    gated = rej.detach() + g * (rej - rej.detach())  # value: rej exactly; gradient: g
    out = p.base_loss()(dataclasses.replace(inp, rejected_logp=gated))
    metrics = {
        **out.metrics,
        "gated_frac": below.float().mean().item(),
        "gate_mean": g.mean().item(),
    }
    return dataclasses.replace(out, metrics=metrics)


@dataclass(frozen=True)
class EDDPOParams:
    beta: float = 0.1
    alpha: float = 0.02  # exploration weight, per-token units (see the docstring on |y|)
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        self.dpo()  # validates beta and label_smoothing

    def dpo(self) -> DPOParams:
        return DPOParams(self.beta, self.label_smoothing)


@PREFERENCE_LOSSES.register("ed_dpo", EDDPOParams, needs={Input.REF_LOGPROBS, Input.LENGTHS})
def ed_dpo(inp: PreferenceInput, p: EDDPOParams) -> PreferenceOutput:
    """ED-iDPO (catalog 001-04): DPO plus EDO's reward-biasing exploration term.

    l(y)  = log pi(y) / |y|                  (per-token log-likelihood, current policy)
    r'(y) = r(y) - alpha * l(y)              (reward biased towards unlikely responses)
    REINFORCE of the bias on the pair, baseline b = (l_w + l_l) / 2:
        alpha * sum_{y in {w, l}} sg(l_y - b) * grad l_y = grad (alpha / 4) (l_w - l_l)^2
    loss  = DPO(beta, label_smoothing) + (alpha / 4) (l_w - l_l)^2

    The abstract fixes only "reward-biasing exploration objectives extended to iterative
    post-training, added to iDPO"; the self-information bias, the pair-mean baseline and
    the per-token normalisation are our reading. The term raises the less likely response
    of the pair and lowers the more likely one, against the sharpening of iterated DPO.
    The iteration (reference = current policy, fresh pairs each round) belongs to the
    trainer; this entry is one round's loss. At a round's start (h = 0) DPO pulls each
    sequence log-prob with beta / 2 and this term with (alpha / 2)(l_w - l_l) / |y|, so
    they balance at a per-token gap of beta |y| / alpha: scale alpha with the response
    length. alpha = 0 is DPO exactly. Needs reference log-probs and lengths.
    """
    l_w, l_l = _per_token(inp, "ed_dpo")
    out = dpo(inp, p.dpo())
    gap = l_w - l_l
    explore = 0.25 * p.alpha * gap**2
    metrics = {
        **out.metrics,
        "explore": explore.detach().mean().item(),
        "logp_tok_gap": gap.detach().mean().item(),
    }
    return dataclasses.replace(out, loss=out.loss + explore, metrics=metrics)
