"""Ratio-based token objectives: PPO clip (+ clip-higher, dual clip), CISPO, REINFORCE,
PPO with a per-token clip range (A²TGPO), CTPO's position-adaptive clip (001-09),
Hard-Pair-GRPO's target fitting (001-14) and the unclipped IS policy gradient."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.core.contract import Input
from rlpost.core.masked import masked_mean
from rlpost.core.numerics import LOG_RATIO_MAX, safe_ratio
from rlpost.core.objectives.base import (
    OBJECTIVES,
    ObjectiveInput,
    ObjectiveOutput,
    clipped_surrogate,
)
from rlpost.core.ratios.base import _check_finite
from rlpost.core.registry import NoParams


@dataclass(frozen=True)
class PPOClipParams:
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO clip-higher: 0.28
    dual_clip: float | None = None  # c > 1 (Ye et al. 2020 use 3.0); None disables

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")


@OBJECTIVES.register("ppo_clip", PPOClipParams)
def ppo_clip(inp: ObjectiveInput, p: PPOClipParams) -> ObjectiveOutput:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with DAPO's asymmetric
    clip-higher (Yu et al. 2025, arXiv:2503.14476) and dual clip (Ye et al. 2020, arXiv:1912.09729).

    r = exp(log_ratio),  J = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    dual clip, for A < 0 only:  J = max(J, c A)
    loss = -w * J  (w: rollout-correction weights).  Shapes ``[B, T]``.
    d loss / d log pi = -w r A where the unclipped branch is active, else 0.
    """
    return clipped_surrogate(inp, 1.0 - p.clip_low, 1.0 + p.clip_high, p.dual_clip)


@dataclass(frozen=True)
class CISPOParams:
    clip_low: float | None = None  # None: no lower bound (as in the paper)
    clip_high: float = 0.28

    def __post_init__(self) -> None:
        if self.clip_high < 0 or (self.clip_low is not None and not 0 <= self.clip_low < 1):
            raise ValueError(f"invalid CISPO clip range {self}")


@OBJECTIVES.register("cispo", CISPOParams)
def cispo(inp: ObjectiveInput, p: CISPOParams) -> ObjectiveOutput:
    """CISPO: clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585).

    J = sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi
    Unlike PPO the clipped token still gets a gradient, scaled by the clipped weight:
    d loss / d log pi = -w * clip(r) * A for every valid token.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    r = safe_ratio(inp.ratio_log().detach())
    lo = 0.0 if p.clip_low is None else 1.0 - p.clip_low
    rc = r.clamp(lo, 1.0 + p.clip_high)
    loss = -w * rc * A * inp.logp_valid() * m
    return ObjectiveOutput(
        loss,
        {
            "clip_frac": masked_mean((rc != r).float(), m).item(),
            "ratio_mean": masked_mean(r, m).item(),
        },
    )


@OBJECTIVES.register("reinforce", NoParams)
def reinforce(inp: ObjectiveInput, p: NoParams) -> ObjectiveOutput:
    """Plain REINFORCE / vanilla policy gradient (Williams 1992).

    loss = -w * A * log pi; on-policy only (the ratio is ignored). Gradient -w A grad log pi.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    return ObjectiveOutput(-w * A * inp.logp_valid() * m, {})


@OBJECTIVES.register("ppo_clip_turn", PPOClipParams, reads={Input.CLIP_RANGE})
def ppo_clip_turn(inp: ObjectiveInput, p: PPOClipParams) -> ObjectiveOutput:
    """PPO clip with a per-token clip range (A²TGPO adaptive turn-level clipping, 001-15).

    With ``clip_range`` eps ``[B, T]`` (e.g. ``AdvantageOutput.clip_range`` of ``a2tgpo``):
    J = min(r A, clip(r, 1 - eps_t, 1 + eps_t) A), dual clip and loss = -w J as ``ppo_clip``.
    Without it, exactly ``ppo_clip`` with the params' ``clip_low`` / ``clip_high``; with a
    constant eps it equals ``ppo_clip(clip_low=clip_high=eps)`` bit for bit (the bounds are
    formed in float64 and rounded once, as Python scalars are). Shapes ``[B, T]``.
    Metric ``clip_range_mean``: mean eps over valid tokens.
    """
    if inp.clip_range is None:
        return ppo_clip(inp, p)
    eps = inp.clip_range.detach()
    if not (torch.isfinite(eps) & (eps >= 0)).all():
        raise ValueError("ppo_clip_turn: clip_range must be finite and >= 0")
    lo = (1.0 - eps.double()).to(inp.logp.dtype)
    hi = (1.0 + eps.double()).to(inp.logp.dtype)
    out = clipped_surrogate(inp, lo, hi, p.dual_clip)
    out.metrics["clip_range_mean"] = masked_mean(eps.float(), inp.mask_f).item()
    return out


@dataclass(frozen=True)
class HardPairParams:
    eta: float = 0.1  # target log-ratio per unit advantage
    delta: float = 0.2  # local probability constraint: |target log-ratio| <= delta

    def __post_init__(self) -> None:
        if self.eta <= 0 or self.delta <= 0:
            raise ValueError(f"need eta > 0 and delta > 0, got eta={self.eta}, delta={self.delta}")


@OBJECTIVES.register("hard_pair_grpo", HardPairParams)
def hard_pair_grpo(inp: ObjectiveInput, p: HardPairParams) -> ObjectiveOutput:
    """Hard-Pair-GRPO (catalog 001-14): local probability constraints + constrained KL fitting.

    Each sampled token gets a *target* log-ratio inside the local constraint,

        tau = clip(eta * A, -delta, delta)          (pi_target(y_t) = pi_old(y_t) e^tau)

    and the policy is fitted to the target rather than pushed along the surrogate:

        loss_t = w * (log r_t - tau)^2 / 2

    the second-order expansion of the KL between the tilted target and pi at the sampled
    token. Properties: at r = 1 the gradient is -tau grad log pi, a positive multiple
    (eta) of the GRPO / PPO gradient whenever |eta A| <= delta (deterministic direction);
    each token's push is bounded by delta whatever the advantage (variance reduction);
    the loss is minimised exactly at log r = tau, with a restoring force beyond it, so
    repeated epochs cannot drift past the constraint (PPO's clip only stops pushing).
    With Soft-Pair-GRPO's pairwise advantages (``soft_pair_grpo``) this is the hard
    variant; the quadratic fitting form and the log-ratio box are our reading.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    tau = (p.eta * A).clamp(-p.delta, p.delta)
    lr = inp.ratio_log()
    loss = 0.5 * w * (lr - tau) ** 2 * m
    return ObjectiveOutput(
        loss,
        {
            "target_at_constraint_frac": masked_mean(
                ((p.eta * A).abs() > p.delta).float(), m
            ).item(),
            "fit_error": masked_mean((lr.detach() - tau).abs(), m).item(),
        },
    )


@dataclass(frozen=True)
class CTPOClipParams:
    clip_low: float = 0.2  # log-space bound at t = 1; -clip_low sqrt(t) at position t
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        _check_finite(self, "clip_low", "clip_high")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip_low and clip_high must be >= 0, got {self}")


@OBJECTIVES.register("ctpo_clip", CTPOClipParams)
def ctpo_clip(inp: ObjectiveInput, p: CTPOClipParams) -> ObjectiveOutput:
    """CTPO position-adaptive log-space clipping (catalog 001-09).

    With t the 1-based index of the token among its response's valid tokens and
    log R_t the ``log_ratio`` (use the ``cumulative`` ratio, whose log grows like sqrt(t)):

        log R~_t = clip(log R_t, -eps_low sqrt(t), eps_high sqrt(t))
        J_t = min(R_t A, exp(log R~_t) A),   loss = -w J_t       ([B, T])

    At t = 1 this is PPO's clip in log space; the bound widens as sqrt(t), the growth of the
    standard deviation of a sum of t independent token log-ratios, so the fraction of
    clipped tokens does not grow with position. Gradient: -w R_t A d log R_t where the
    unclipped branch is active, else 0. Since exp is monotone, clipping log R_t equals
    clipping R_t to [exp(-eps_low sqrt t), exp(eps_high sqrt t)]: this is PPO's
    :func:`~rlpost.core.objectives.clipped_surrogate` with per-token bounds (same metrics).
    R_t is ``safe_ratio(log R_t)``: a cumulative log-ratio beyond ``LOG_RATIO_MAX`` (long
    responses) saturates instead of overflowing, so loss and gradient stay finite.
    """
    sq = inp.mask_f.cumsum(1).clamp_min(1.0).sqrt()
    lo = (-p.clip_low * sq).clamp(min=-LOG_RATIO_MAX).exp()
    hi = (p.clip_high * sq).clamp(max=LOG_RATIO_MAX).exp()
    return clipped_surrogate(inp, lo, hi)


@OBJECTIVES.register("is_pg", NoParams)
def is_pg(inp: ObjectiveInput, p: NoParams) -> ObjectiveOutput:
    """Unclipped importance-sampled policy gradient, the objective a trust-region *mask*
    (DPPO, ``predictive_divergence_mask``, catalog 004-05) pairs with:

        loss = -w r A,   r = exp(log_ratio),   d loss / d log pi = -w r A   ([B, T])

    The trust region enters only through the correction's mask / weights ``w``.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    r = safe_ratio(inp.ratio_log())
    return ObjectiveOutput(-w * r * A * m, {"ratio_mean": masked_mean(r.detach(), m).item()})
