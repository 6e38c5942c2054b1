"""Entropy-driven advantage shaping: Entrocraft (catalog 001-28) and FADE (catalog 004-21).

Both estimators read :class:`~rlpost.core.advantages.TrainingDynamics` (training progress,
current and initial policy entropy) and reshape a group-relative base advantage:

* ``entrocraft`` rejects (zeroes) responses whose contribution to the predicted entropy
  change points the wrong way, so the entropy follows a user schedule H*(progress);
* ``fade`` splits the advantage into positive / negative mass on a hard / easy axis and
  re-weights the four parts with a focal schedule driven by the entropy drop.

Shapes: ``B`` responses, ``T`` response tokens. Outputs are ``[B, T]`` when
``AdvantageInput.mask`` is given, else ``[B]``, like every ``ADVANTAGES`` entry.
The abstracts give neither formulas nor hyper-parameters; the readings stated in each
docstring are ours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    TrainingDynamics,
    broadcast,
    response_rewards,
    scalarize_rewards,
)
from rlpost.core.advantages.classic import GRPOParams, grpo
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats, masked_mean

# ----------------------------------------------------------------------------- Entrocraft


@dataclass(frozen=True)
class EntrocraftParams:
    start: float = 1.0  # target entropy at progress 0 (x initial_entropy, or nats if absolute)
    end: float = 0.8  # target entropy at progress 1 (linear in between)
    absolute: bool = False  # True: start / end are in nats, initial_entropy is not needed
    gain: float = 10.0  # rejection probability per unit of relative entropy error
    p_max: float = 1.0  # cap on the rejection probability
    seed: int = 0  # the rejection draws are a function of (seed, progress) only
    base: str = "grpo"  # base advantage estimator (any ADVANTAGES entry but entrocraft)
    base_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.start > 0 and self.end > 0):
            raise ValueError(f"start and end must be > 0, got start={self.start}, end={self.end}")
        if self.gain < 0:
            raise ValueError(f"gain must be >= 0, got {self.gain}")
        if not 0.0 <= self.p_max <= 1.0:
            raise ValueError(f"p_max must be in [0, 1], got {self.p_max}")
        if self.base == "entrocraft":
            raise ValueError("base cannot be 'entrocraft' itself")
        ADVANTAGES.build(self.base, **dict(self.base_params))  # unknown name / bad params fail now


def entrocraft_target(dyn: TrainingDynamics, p: EntrocraftParams) -> float:
    """H*(progress) = start + (end - start) * progress, in nats (x initial_entropy unless
    ``absolute``)."""
    frac = p.start + (p.end - p.start) * dyn.progress
    if p.absolute:
        return frac
    if dyn.initial_entropy is None:
        raise ValueError(
            "entrocraft needs AdvantageInput.dynamics.initial_entropy for a relative "
            "schedule (or set absolute=True)"
        )
    return frac * dyn.initial_entropy


def _response_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """``[B, T] -> [B]`` mean over valid tokens (all tokens without a mask); ``[B]`` passes."""
    return x if x.dim() == 1 else masked_mean(x.float(), mask, dim=1)


def _draw_seed(seed: int, progress: float) -> int:
    """A generator seed per (seed, progress): the same step redraws the same uniforms.

    The CPU generator (mt19937) keeps only the low 32 bits of its seed, so the pair is
    hashed into 32 bits rather than packed into a wide integer."""
    key = f"{seed}:{progress!r}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")


@ADVANTAGES.register(
    "entrocraft",
    EntrocraftParams,
    needs={Input.BEHAVIOUR_LOGPROBS, Input.DYNAMICS},
    coupling=Coupling.BATCH,
)
def entrocraft(inp: AdvantageInput, p: EntrocraftParams) -> AdvantageOutput:
    """Entrocraft: rejection sampling of the advantage distribution to follow a user
    entropy schedule (catalog 001-28).

    Reading. To first order the per-step entropy change of a softmax policy is
    ``dH ~ -eta * Cov_{y~pi}(log pi(y), A(y))``, so each response contributes

        c_i = (l_i - mean_g l) * A_i,     l_i = mean_t logprobs[i, t] over valid tokens

    (``mean_g``: over the response's group, i.e. the same prompt/state; ``A_i`` the base
    advantage, averaged over valid tokens when it is per token). c_i > 0 lowers the
    entropy, c_i < 0 raises it. With the target H* = start + (end - start) * progress
    (times ``initial_entropy`` unless ``absolute``) and the current entropy H:

        q  = min(p_max, gain * |H* - H| / H*)
        H < H*: each response with c_i > 0 is rejected (A_i := 0) with probability q
        H > H*: each response with c_i < 0 is rejected with probability q

    Rejected responses keep no gradient; the others keep their base advantage unscaled, so
    H == H* returns exactly the base estimator. The uniforms come from a
    ``torch.Generator`` seeded by (``seed``, progress): deterministic, no global RNG.
    The base is ``grpo`` by default; any other entry name with ``base_params`` (validated
    at build) works, as the paper's method is estimator-agnostic.

    Needs ``logprobs`` ``[B, T]`` (behaviour log-probs of the sampled tokens) and
    ``dynamics`` with ``entropy`` (and ``initial_entropy`` for a relative schedule).
    Metrics: ``entrocraft_target``, ``entrocraft_entropy``, ``entrocraft_reject_prob`` (q),
    ``entrocraft_rejected_frac``, ``entrocraft_cov_before`` / ``_after`` (mean of c_i
    over the batch before and after rejection: the predicted dH is -eta times it).
    Left out: the paper's exact acceptance rule and any re-normalisation of the kept
    advantages (abstract only).
    """
    if inp.logprobs is None:
        raise ValueError("entrocraft needs AdvantageInput.logprobs ([B, T] behaviour log-probs)")
    dyn = inp.dynamics
    if dyn is None or dyn.entropy is None:
        raise ValueError("entrocraft needs AdvantageInput.dynamics with the current entropy")
    target = entrocraft_target(dyn, p)
    if target <= 0:
        raise ValueError("entrocraft: the target entropy is 0 (initial_entropy is 0)")
    base = ADVANTAGES.build(p.base, **dict(p.base_params))(inp)
    adv = base.advantages  # [B] or [B, T]
    a_resp = _response_mean(adv, inp.mask)  # [B]
    lp = _response_mean(inp.logprobs, inp.mask)  # [B]
    c = (lp - group_stats(lp, inp.group_ids).mean) * a_resp  # [B]

    err = target - dyn.entropy
    q = min(p.p_max, p.gain * abs(err) / target)
    wrong_way = c > 0 if err > 0 else c < 0  # err == 0: q == 0, nothing is rejected
    gen = torch.Generator(device="cpu").manual_seed(_draw_seed(p.seed, dyn.progress))
    u = torch.rand(c.shape, generator=gen, dtype=torch.float64, device="cpu").to(c.device)
    reject = wrong_way & (u < q)
    keep = (~reject).to(adv.dtype)
    out = adv * (keep if adv.dim() == 1 else keep[:, None])
    return AdvantageOutput(
        out,
        returns=base.returns,
        metrics={
            **base.metrics,
            "entrocraft_target": float(target),
            "entrocraft_entropy": float(dyn.entropy),
            "entrocraft_reject_prob": float(q),
            "entrocraft_rejected_frac": reject.float().mean().item(),
            "entrocraft_cov_before": c.mean().item(),
            "entrocraft_cov_after": (c * keep.float()).mean().item(),
        },
    )


# ----------------------------------------------------------------------------- FADE


class FADEParts(NamedTuple):
    """Four ``[B]`` parts of an advantage; they sum back to it (sign x difficulty axes)."""

    pos_hard: Tensor  # max(A, 0) * (1 - p)
    pos_easy: Tensor  # max(A, 0) * p
    neg_hard: Tensor  # min(A, 0) * (1 - p)
    neg_easy: Tensor  # min(A, 0) * p


def fade_decompose(adv: Tensor, success_rate: Tensor) -> FADEParts:
    """Split ``adv`` ``[B]`` by sign and (soft) difficulty, ``success_rate`` ``[B]`` in [0, 1]
    (each response's group success rate p_g):

        A = A+ + A-,  A+ = max(A, 0), A- = min(A, 0)
        A+/- = A+/- (1 - p_g) [hard] + A+/- p_g [easy]

    A problem is "hard" in proportion to its failure rate. The four parts sum to ``adv``
    up to float rounding.
    """
    if adv.shape != success_rate.shape or adv.dim() != 1:
        raise ValueError(
            f"fade_decompose expects [B] adv and success_rate, got {tuple(adv.shape)} "
            f"and {tuple(success_rate.shape)}"
        )
    p = success_rate.to(adv.dtype)
    pos, neg = adv.clamp_min(0), adv.clamp_max(0)
    return FADEParts(pos * (1 - p), pos * p, neg * (1 - p), neg * p)


@dataclass(frozen=True)
class FADEParams:
    gamma: float = 2.0  # focal exponent of the hard focus (1 - p)^gamma
    suppress: float = 0.5  # negative-mass suppression at e = 0 (pure exploitation), in [0, 1]
    margin: float = 0.3  # relative entropy drop at which the phase is fully exploratory
    threshold: float = 0.0  # success: outcome reward > threshold
    min_weight: float = 0.05  # floor of both difficulty profiles (before normalisation)
    scale_by_std: bool = True  # base GRPO advantage (False: Dr. GRPO)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_weight <= 1.0:
            raise ValueError(f"min_weight must be in [0, 1], got {self.min_weight}")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if not 0.0 <= self.suppress <= 1.0:
            raise ValueError(f"suppress must be in [0, 1], got {self.suppress}")
        if not self.margin > 0:
            raise ValueError(f"margin must be > 0, got {self.margin}")


def fade_phase(dyn: TrainingDynamics, margin: float) -> float:
    """Exploration signal e = clip((H0 - H) / (margin * H0), 0, 1): 0 while the entropy is
    at its initial level (exploit), 1 once it has dropped by ``margin`` of it (explore)."""
    if dyn.entropy is None or dyn.initial_entropy is None:
        raise ValueError("fade needs AdvantageInput.dynamics with entropy and initial_entropy")
    if dyn.initial_entropy <= 0:
        return 0.0
    drop = (dyn.initial_entropy - dyn.entropy) / (margin * dyn.initial_entropy)
    return min(1.0, max(0.0, drop))


def fade_difficulty_weights(
    success_rate: Tensor,
    e: float,
    gamma: float,
    active: Tensor | None = None,
    min_weight: float = 0.0,
) -> Tensor:
    """Difficulty weight per group, ``[G]`` (``success_rate`` ``[G]`` in [0, 1]):

        w = e * max((1 - p)^gamma, f) / mean(.) + (1 - e) * max(4 p (1 - p), f) / mean(.)

    hard focus (exploration) mixed with medium focus (exploitation), each floored at
    ``min_weight`` = f *before* it is normalised to mean 1 over the ``active`` groups
    (default all). The floor keeps the signal of groups a profile would zero out: with
    non-binary rewards a group where every reward clears the threshold (p = 1) still has
    distinct rewards and a non-zero advantage, yet both raw profiles give it 0 (and p = 0
    groups get 0 from the medium profile). A profile whose mean is 0 there is replaced by
    ones.
    """
    p = success_rate.float()
    act = torch.ones_like(p, dtype=torch.bool) if active is None else active.bool()

    def unit_mean(w: Tensor) -> Tensor:
        m = w[act].mean() if act.any() else w.new_zeros(())
        return w / m if m > 0 else torch.ones_like(w)

    hard = unit_mean((1 - p).pow(gamma).clamp_min(min_weight))
    medium = unit_mean((4 * p * (1 - p)).clamp_min(min_weight))
    return e * hard + (1 - e) * medium


@ADVANTAGES.register("fade", FADEParams, needs={Input.DYNAMICS}, coupling=Coupling.GROUP)
def fade(inp: AdvantageInput, p: FADEParams) -> AdvantageOutput:
    """FADE, Focal Advantage with Dynamic Entropy (catalog 004-21), on GRPO advantages.

    Reading. The GRPO advantage A is decomposed (:func:`fade_decompose`) into positive /
    negative mass (sign axis) and hard / easy mass with the soft split by the group
    success rate p_g (``reward > threshold``; difficulty axis). An exploration signal from
    the entropy dynamics, e = clip((H0 - H) / (margin H0), 0, 1) (:func:`fade_phase`),
    schedules both axes: a falling entropy calls for exploration, which favours balance
    and hard focus; a high entropy for exploitation, which favours suppression of the
    negative mass and medium focus:

        w_neg   = 1 - (1 - e) * suppress
        w_diff  = e * max((1 - p_g)^gamma, f) / Z_hard + (1 - e) * max(4 p_g (1 - p_g), f) / Z_med
        A_fade  = w_diff * (A+_hard + A+_easy + w_neg * (A-_hard + A-_easy))

    Z_* normalise each difficulty profile to mean 1 over the batch's groups with a
    non-degenerate reward (:func:`fade_difficulty_weights`). The floor f = ``min_weight``
    keeps every non-degenerate group's signal: with continuous rewards a group whose
    rewards all clear the threshold (p_g = 1) or all miss it (p_g = 0) still ranks its
    responses, and without the floor both profiles (at p_g = 1) or the medium one (at
    p_g = 0) would drop it. ``min_weight = 0`` gives the unfloored profiles. Groups with equal rewards
    have A = 0 and stay 0. Needs ``dynamics`` (``entropy``, ``initial_entropy``).
    Metrics: ``fade_phase`` (e), ``fade_neg_weight``, and the share of |A| mass in each of
    the four parts (``fade_mass_pos_hard`` ...).
    Left out: the paper's own weight functions and schedule (abstract only).
    """
    if inp.dynamics is None:
        raise ValueError("fade needs AdvantageInput.dynamics with entropy and initial_entropy")
    e = fade_phase(inp.dynamics, p.margin)
    base = grpo(inp, GRPOParams(p.scale_by_std, p.eps))
    adv = _response_mean(base.advantages, inp.mask)  # [B] response-level GRPO advantage
    rs = group_stats(response_rewards(inp), inp.group_ids)
    success = group_stats((scalarize_rewards(inp) > p.threshold).float(), inp.group_ids).mean
    parts = fade_decompose(adv, success)
    w_neg = 1.0 - (1.0 - e) * p.suppress
    # difficulty weights per group [G] (normalised over groups, not responses), then [B]
    g = rs.index
    n_groups = int(g.max()) + 1 if g.numel() else 0
    p_group = success.new_zeros(n_groups).scatter_(0, g, success)
    active = torch.zeros(n_groups, dtype=torch.bool, device=g.device).scatter_(0, g, rs.std > 0)
    w_diff = fade_difficulty_weights(p_group, e, p.gamma, active, p.min_weight)[g]  # [B]
    out = w_diff * (parts.pos_hard + parts.pos_easy + w_neg * (parts.neg_hard + parts.neg_easy))
    total = adv.abs().sum().clamp_min(1e-12)
    mass = {f"fade_mass_{k}": (v.abs().sum() / total).item() for k, v in parts._asdict().items()}
    return AdvantageOutput(
        broadcast(out, inp.mask),
        metrics={**base.metrics, "fade_phase": e, "fade_neg_weight": w_neg, **mass},
    )
