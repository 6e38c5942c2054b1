"""Reward shaping inside group-relative advantages: RiVER (004-29), HMPO (004-11b),
ICR (001-10), Soft-Pair-GRPO (001-14), ED-GRPO (001-04), SLAS (000-29) and the
reward-weighted regression weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    _metrics,
    broadcast,
    group_normalize,
    response_rewards,
)
from rlpost.core.advantages.classic import GRPOParams, grpo
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats, group_sum, masked_mean


@dataclass(frozen=True)
class RiVERParams:
    other_credit: float = 0.5  # upper bound of the credit of non-top solutions, in [0, 1)

    def __post_init__(self) -> None:
        if not 0.0 <= self.other_credit < 1.0:
            raise ValueError(f"other_credit must be in [0, 1), got {self.other_credit}")


@ADVANTAGES.register("river", RiVERParams, coupling=Coupling.GROUP)
def river(inp: AdvantageInput, p: RiVERParams) -> AdvantageOutput:
    """RiVER ranking-induced calibrated shaping of continuous scores (catalog 004-29).

    For score-based tasks without ground truth. Within each instance (group), the *distinct*
    score values are ranked, best first: u = 1..U. The shaped reward is

        s = 1                                   for the top value (u = 1)
        s = c * (U - u) / (U - 1)               otherwise (bounded credit in [0, c), c < 1)

    which depends only on the order of the scores, so any per-instance rescaling a*x + b
    (a > 0) leaves it unchanged ("scale dominance"). The baseline is the mean of s over the
    distinct values, and each sample's advantage is divided by the number of samples that
    share its score value:

        A_i = (s_i - mean_{distinct v} s(v)) / count(score_i)

    so every distinct solution value carries the same total gradient mass whatever its
    frequency: k duplicates of a low score together weigh exactly as much as one sample
    of that score, and can never outweigh the top solution ("frequency dominance").
    Choices left open by the abstract (the credit curve, the de-duplicated baseline, the
    1/count normalisation) are ours; groups with a single distinct value get A = 0.
    """
    r = response_rewards(inp)
    g = group_stats(r, inp.group_ids).index
    # pairwise comparisons inside each group, vectorised: [B, B] (groups are small)
    same_group = g[:, None] == g[None, :]
    better = same_group & (r[None, :] > r[:, None])  # j beats i
    equal = same_group & (r[None, :] == r[:, None])
    count = equal.sum(1).float()  # samples sharing i's value (incl. i)
    # rank among distinct values: 1 + number of distinct better values
    inv_count = 1.0 / count
    u = 1.0 + (better.float() * inv_count[None, :]).sum(1)  # each better value counted once
    U = (same_group.float() * inv_count[None, :]).sum(1)  # distinct values in the group
    credit = torch.where(
        U > 1, p.other_credit * (U - u) / (U - 1).clamp_min(1.0), torch.zeros_like(u)
    )
    shaped = torch.where(u == 1, torch.ones_like(u), credit)
    baseline = (same_group.float() * (shaped * inv_count)[None, :]).sum(1) / U
    s_adv = torch.where(U > 1, (shaped - baseline) / count, torch.zeros_like(r))
    return AdvantageOutput(broadcast(s_adv, inp.mask), metrics=_metrics(s_adv, r))


@dataclass(frozen=True)
class HMPOParams:
    alpha: float = 0.2  # length-shaping strength; < 0.5 keeps every correct above every wrong
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha < 0.5:
            raise ValueError(f"alpha must be in [0, 0.5), got {self.alpha}")


@ADVANTAGES.register("hmpo", HMPOParams, needs={Input.MASK}, coupling=Coupling.GROUP)
def hmpo(inp: AdvantageInput, p: HMPOParams) -> AdvantageOutput:
    """HMPO median-length token-efficiency shaping (Mach-Mind-4-Flash, catalog 004-11b).

    Among the *correct* responses of a group (reward > 0), length is compared with their
    (lower) median length m_g:

        b_i = alpha * 1[correct_i] * clip((m_g - |y_i|) / m_g, -1, 1)
        A_i = GRPO(r)_i + (b_i - mean_g b)

    Shorter-than-median correct responses gain, longer ones lose, wrong ones are unchanged.
    The length term keeps its own scale: it separates two responses by at most 2 alpha < 1,
    where the correctness term separates a correct from a wrong one by at least 1 (sqrt 2
    with std scaling: the unbiased std of 0/1 rewards is at most 1/sqrt 2). So with binary
    rewards every correct response still scores above every wrong one, and the shaping
    trades length only within the correct set (the accuracy-preserving part). Single stage: no separate compression
    phase. The abstract names the method only; this median-relative form is our reading.
    Needs ``mask`` (response lengths).
    """
    if inp.mask is None:
        raise ValueError("hmpo needs AdvantageInput.mask (response lengths)")
    r = response_rewards(inp)
    lengths = inp.mask.float().sum(1)
    correct = r > 0
    g = group_stats(r, inp.group_ids).index
    G = int(g.max()) + 1 if g.numel() else 0
    # per-group (lower) median length of the correct responses: one masked sort, [G, B]
    member = (g[None, :] == torch.arange(G, device=g.device)[:, None]) & correct[None, :]
    table = torch.where(member, lengths[None, :], torch.finfo(lengths.dtype).max)
    n_correct = member.sum(1)
    mid = ((n_correct - 1).clamp_min(0) // 2)[:, None]
    median = torch.where(n_correct > 0, table.sort(1).values.gather(1, mid).squeeze(1), 1.0)
    m = median[g].clamp_min(1.0)
    bonus = p.alpha * correct.float() * ((m - lengths) / m).clamp(-1.0, 1.0)
    # the length term is added at its own scale, centred per group, after the correctness
    # term is normalised: normalising r + bonus together divided a group of all-correct
    # responses by the spread of their bonuses alone, so length alone decided its
    # advantages at full scale (a toy run shortened answers at a 14-point accuracy cost;
    # test_hmpo.py). Without std scaling the two forms are the same.
    adv = group_normalize(r, inp.group_ids, p.scale_by_std, p.eps) + group_normalize(
        bonus, inp.group_ids, False, 0.0
    )
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={**_metrics(adv, r), "hmpo_bonus_mean": bonus.mean().item()},
    )


@dataclass(frozen=True)
class ICRParams:
    coef: float = 0.1  # lambda: strength of the pull toward the shortest correct responses
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"coef must be >= 0, got {self.coef}")


@ADVANTAGES.register("icr", ICRParams, needs={Input.MASK}, coupling=Coupling.GROUP)
def icr(inp: AdvantageInput, p: ICRParams) -> AdvantageOutput:
    """ICR implicit compression regularisation (catalog 001-10), on GRPO advantages.

    Per group, rho_g = Pearson correlation between response length and correctness
    (reward > 0). rho_g < 0 is the *overthinking* regime (shorter answers are more often
    right); there the shortest correct responses of the group — the "virtual shorter
    distribution" already present in the rollouts — receive an extra advantage:

        A_i = A_i^GRPO + coef * 1[rho_g < 0] * 1[i is a shortest correct response of g]

    With rho_g >= 0 (underthinking or neutral) the regulariser is off and A = A^GRPO.
    The additive on-policy form is our reading of the abstract. Needs ``mask``.
    """
    if inp.mask is None:
        raise ValueError("icr needs AdvantageInput.mask (response lengths)")
    base = grpo(inp, GRPOParams(p.scale_by_std, p.eps))
    adv = base.advantages[:, 0] if base.advantages.dim() == 2 else base.advantages
    r = response_rewards(inp)
    lengths = inp.mask.float().sum(1)
    correct = (r > 0).float()
    g = group_stats(lengths, inp.group_ids).index
    G = int(g.max()) + 1
    # the sign of rho_g is the sign of n^2 cov_g = n sum(l c) - sum(l) sum(c): integers
    # (token counts, 0/1), so exact in float64; a float32 covariance of an exactly
    # uncorrelated group rounds to +-1e-7 and switched the regulariser on at random
    l64, c64, gid = lengths.double(), correct.double(), inp.group_ids
    n = group_sum(torch.ones_like(l64), gid)
    overthinking = n * group_sum(l64 * c64, gid) - group_sum(l64, gid) * group_sum(c64, gid) < 0
    big = torch.finfo(lengths.dtype).max
    shortest = lengths.new_full((G,), big).scatter_reduce(
        0, g, torch.where(correct > 0, lengths, big), reduce="amin"
    )[g]
    target = (correct > 0) & (lengths == shortest) & overthinking
    adv = adv + p.coef * target.float()
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={
            **base.metrics,
            "icr_active_frac": float(overthinking.float().mean()),
            "icr_targets": float(target.sum()),
        },
    )


@dataclass(frozen=True)
class SoftPairParams:
    scale_by_std: bool = False  # optionally GRPO-normalise the pairwise rewards
    eps: float = 1e-6


@ADVANTAGES.register("soft_pair_grpo", SoftPairParams, coupling=Coupling.GROUP)
def soft_pair_grpo(inp: AdvantageInput, p: SoftPairParams) -> AdvantageOutput:
    """Soft-Pair-GRPO (catalog 001-14): binary pairwise preferences replace the
    group-normalised scalar reward inside GRPO.

    For response i of a group of n, against every other response j of the group:

        A_i = (1 / (n - 1)) * sum_{j != i} pref(i, j),   pref = +1/2 if r_i > r_j,
                                                               -1/2 if r_i < r_j, 0 on ties

    i.e. the within-group win rate minus 1/2 (zero-mean per group). Only the *order* of
    rewards matters. With two reward levels (binary verifiers) A is an exact positive
    multiple of r_i - mean_g(r) within each group, so the policy gradient is a positive
    multiple of (Dr.) GRPO's; for continuous rewards the two gradients agree to first
    order in direction (positive inner product). The clipped surrogate and KL of GRPO are
    kept by the preset. Singleton groups give 0.
    """
    r = response_rewards(inp)
    g = group_stats(r, inp.group_ids)
    same = g.index[:, None] == g.index[None, :]  # [B, B]; groups are small
    pref = 0.5 * torch.sign(r[:, None] - r[None, :]) * same.float()
    adv = pref.sum(1) / (g.count - 1).clamp_min(1.0)
    if p.scale_by_std:
        adv = adv / (group_stats(adv, inp.group_ids).std + p.eps)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@dataclass(frozen=True)
class EDGRPOParams:
    alpha: float = 0.05  # weight of the self-information bonus (advantage units per nat)
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")


@ADVANTAGES.register(
    "ed_grpo",
    EDGRPOParams,
    needs={Input.MASK, Input.BEHAVIOUR_LOGPROBS},
    coupling=Coupling.GROUP,
)
def ed_grpo(inp: AdvantageInput, p: EDGRPOParams) -> AdvantageOutput:
    """ED-GRPO, exploration-driven GRPO (EDO, catalog 001-04).

    Reward biasing towards exploration: each response gets a bonus proportional to its
    per-token self-information under the behaviour policy, centred in its group and added
    *after* GRPO's normalisation of the task reward,

        nll_i = -(1/|y_i|) sum_t log pi_old(y_t)            (nats per token)
        A_i   = GRPO(r)_i + alpha * (nll_i - mean_g(nll))

    In expectation over samples the bonus term of the policy gradient is
    alpha * E[-log pi(y) grad log pi(y)] = alpha * grad H(pi) (per token): an entropy
    bonus carried by the advantage, of a size set by ``alpha`` alone (the group std
    divides the task reward only, so in a group of equal rewards the bonus is not blown
    up to unit scale: alpha = 1e-4 gives a 1000x smaller push than alpha = 0.1). It also
    separates groups whose rewards are all equal (less likely correct answers gain).
    alpha = 0 is GRPO exactly. Needs ``logprobs`` and ``mask``. The bonus form is our
    reading of "reward-biasing style exploration objectives".
    """
    if inp.logprobs is None or inp.mask is None:
        raise ValueError("ed_grpo needs AdvantageInput.logprobs and mask ([B, T])")
    nll = -masked_mean(inp.logprobs.float().detach(), inp.mask, dim=1)
    r = response_rewards(inp)
    bonus = p.alpha * (nll - group_stats(nll, inp.group_ids).mean)
    adv = group_normalize(r, inp.group_ids, p.scale_by_std, p.eps) + bonus
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={**_metrics(adv, r), "ed_bonus_abs_mean": bonus.abs().mean().item()},
    )


@dataclass(frozen=True)
class SLASParams:
    gamma: float = 0.5  # super-linear exponent: A -> sign(A) |A|^(1 + gamma)
    eps: float = 1e-4

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"SLAS gamma must be >= 0 (super-linear), got {self.gamma}")


@ADVANTAGES.register("slas", SLASParams, coupling=Coupling.BATCH)
def slas(inp: AdvantageInput, p: SLASParams) -> AdvantageOutput:
    """Super-Linear Advantage Shaping (SLAS, catalog 000-29).

    1. ``A0 = r - mean_group(r)``: the prompt-level std is removed (the abstract: dividing
       by it miscalibrates, and without it the ascent direction is linear in A);
    2. ``A = A0 / (std_batch(A0) + eps)``: batch-level normalisation (population std over
       the batch; stable across reward scales);
    3. ``A_slas = sign(A) |A|^(1 + gamma)``: the advantage-dependent Fisher-Rao weighting
       ``|A|^gamma`` (our reading of the abstract) relaxes the metric along high-|A|
       directions and tightens it where |A| is small, so informative samples are amplified
       and near-zero (noise-level) advantages are suppressed super-linearly.

    ``gamma = 0`` is the linear, batch-normalised baseline. Ratios between two samples'
    advantages are raised to the power ``1 + gamma``; the result is invariant to any
    positive rescaling of the rewards and to a per-group shift.
    """
    r = response_rewards(inp)
    centred = r - group_stats(r, inp.group_ids).mean
    adv = centred / (centred.std(unbiased=False) + p.eps)
    adv = adv.sign() * adv.abs().pow(1.0 + p.gamma)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@dataclass(frozen=True)
class RewardWeightedParams:
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@ADVANTAGES.register("reward_weighted", RewardWeightedParams, coupling=Coupling.BATCH)
def reward_weighted(inp: AdvantageInput, p: RewardWeightedParams) -> AdvantageOutput:
    """Reward-weighted regression weights (Peters & Schaal 2007): ``B softmax(r / T)``.

    Non-negative, mean 1 over the batch: not a centred advantage but the weight of each
    sample's supervised (regression) loss, as in reward-weighted flow matching (RWR).
    """
    r = response_rewards(inp)
    w = torch.softmax(r / p.temperature, 0) * r.numel()
    return AdvantageOutput(broadcast(w, inp.mask), metrics=_metrics(w, r))
