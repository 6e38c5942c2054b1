"""Advantage estimators: rewards (scalar or vector), groups, masks, values -> advantages.

Every entry has the signature ``fn(AdvantageInput, params) -> AdvantageOutput``.

Shapes: ``B`` responses, ``T`` response tokens, ``K`` reward components.

* ``rewards``: ``[B]`` or ``[B, K]``. Vector rewards are reduced by
  :func:`scalarize_rewards` (weighted sum, ``reward_weights`` default all ones) unless an
  estimator consumes the vector itself.
* ``group_ids``: ``[B]`` integer prompt labels (responses sharing a prompt share a label).
* ``mask``: ``[B, T]`` response-token mask. When given, outputs are per token ``[B, T]``
  (a response-level advantage broadcast over its valid tokens, 0 on masked tokens);
  without it they are per response ``[B]``.
* ``token_rewards``: optional ``[B, T]`` dense rewards (e.g. ``-beta * KL`` in the reward,
  see :func:`rlpost.core.kl.kl_reward_penalty`), added to the outcome reward that sits on
  each response's last valid token.
* ``values``: ``[B, T]`` critic values V(s_t) for GAE.
* ``logprobs``: optional ``[B, T]`` behaviour log-probs of the sampled tokens (EDO's
  self-information bonus, Entrocraft's covariance rule).
* ``features``: optional ``[B, D]`` per-response (or per-prompt) embeddings (BASIS's
  cross-prompt value estimate, GCPO's semantic disagreement).
* ``reward_mask``: optional ``[B, K]`` bool, which reward components apply to a response
  (RDPO's active reward subspaces in multi-task batches); inactive entries are ignored.
* ``turn_ids`` / ``turn_rewards``: optional ``[B, T]`` turn index of each token (-1: not a
  policy token) and ``[B, U]`` per-turn intrinsic signals (A²TGPO's information gain).
* ``dynamics``: optional :class:`TrainingDynamics` (progress, current and initial policy
  entropy) for schedule-driven estimators (Entrocraft, FADE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpost.core.masked import group_stats, group_sum, masked_mean, masked_whiten
from rlpost.core.registry import NoParams, Registry


@dataclass(frozen=True)
class TrainingDynamics:
    """Scalars of the training run that schedule-driven estimators read.

    ``progress``: fraction of training done, in [0, 1]. ``entropy``: the current mean token
    entropy of the policy (nats). ``initial_entropy``: the same at the start of training.
    """

    progress: float = 0.0
    entropy: float | None = None
    initial_entropy: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.progress <= 1.0:
            raise ValueError(f"progress must be in [0, 1], got {self.progress}")
        for name in ("entropy", "initial_entropy"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite entropy >= 0, got {v}")


@dataclass(frozen=True)
class AdvantageInput:
    rewards: Tensor
    group_ids: Tensor | None = None
    mask: Tensor | None = None
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    reward_weights: Tensor | None = None
    logprobs: Tensor | None = None
    features: Tensor | None = None
    reward_mask: Tensor | None = None
    turn_ids: Tensor | None = None
    turn_rewards: Tensor | None = None
    dynamics: TrainingDynamics | None = None

    def __post_init__(self) -> None:
        r = self.rewards
        if r.dim() not in (1, 2):
            raise ValueError(f"rewards must be [B] or [B, K], got shape {tuple(r.shape)}")
        B = r.shape[0]
        for name in ("mask", "values", "token_rewards", "logprobs", "turn_ids"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[0] != B):
                raise ValueError(f"{name} must be [B={B}, T], got shape {tuple(t.shape)}")
            if t is not None and self.mask is not None and t.shape != self.mask.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != mask {tuple(self.mask.shape)}")
        for name in ("features", "turn_rewards"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[0] != B):
                raise ValueError(f"{name} must be [B={B}, D], got shape {tuple(t.shape)}")
        if self.reward_mask is not None and (r.dim() != 2 or self.reward_mask.shape != r.shape):
            raise ValueError(
                f"reward_mask must match [B, K] rewards {tuple(r.shape)}, "
                f"got {tuple(self.reward_mask.shape)}"
            )
        if self.group_ids is not None and tuple(self.group_ids.shape) != (B,):
            raise ValueError(f"group_ids must be [B={B}], got {tuple(self.group_ids.shape)}")
        if self.reward_weights is not None and (
            r.dim() != 2 or self.reward_weights.shape != (r.shape[1],)
        ):
            raise ValueError("reward_weights must be [K] and rewards [B, K]")
        finite = torch.isfinite(r)
        if self.reward_mask is not None:
            finite = finite | ~self.reward_mask.bool()  # inactive entries may hold NaN
        if not finite.all():
            raise ValueError("rewards contain NaN or inf")


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: Tensor  # [B, T] when a mask was given, else [B]
    returns: Tensor | None = None  # [B, T] value targets (GAE)
    clip_range: Tensor | None = None  # [B, T] per-token clip half-width (A²TGPO)
    metrics: dict[str, float] = field(default_factory=dict)


ADVANTAGES: Registry[AdvantageInput, AdvantageOutput] = Registry(
    "advantage estimator", AdvantageInput, AdvantageOutput
)


def scalarize_rewards(inp: AdvantageInput) -> Tensor:
    """``[B, K] -> [B]`` weighted sum (weights default to 1); ``[B]`` passes through."""
    r = inp.rewards
    if r.dim() == 1:
        return r.float()
    if inp.reward_mask is not None:  # inactive components count as 0
        r = torch.where(inp.reward_mask.bool(), r, torch.zeros_like(r))
    w = inp.reward_weights if inp.reward_weights is not None else r.new_ones(r.shape[1])
    return r.float() @ w.to(r.device, torch.float32)


def response_rewards(inp: AdvantageInput) -> Tensor:
    """Scalar reward per response ``[B]``: the (scalarised) outcome plus the sum of the
    dense ``token_rewards`` over valid tokens (e.g. r - beta * sum_t KL_t, as in RLOO's
    KL-in-reward), so response-level estimators do not silently drop in-reward penalties."""
    r = scalarize_rewards(inp)
    if inp.token_rewards is not None:
        m = inp.mask.float() if inp.mask is not None else torch.ones_like(inp.token_rewards)
        r = r + (inp.token_rewards.float() * m).sum(1)
    return r


def last_token_index(mask: Tensor) -> Tensor:
    """Index of each row's last valid token, ``[B]`` (0 for an empty row)."""
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), pos, torch.zeros_like(pos)).amax(dim=1)


def token_reward_matrix(inp: AdvantageInput) -> Tensor:
    """Dense ``[B, T]`` rewards: outcome reward at the last valid token + ``token_rewards``."""
    assert inp.mask is not None
    m = inp.mask.float()
    r = torch.zeros_like(m)
    r.scatter_(1, last_token_index(inp.mask).unsqueeze(1), scalarize_rewards(inp).unsqueeze(1))
    if inp.token_rewards is not None:
        r = r + inp.token_rewards.float()
    return r * m


def broadcast(adv: Tensor, mask: Tensor | None) -> Tensor:
    """``[B] -> [B, T]`` over valid tokens when a mask is given."""
    return adv if mask is None else adv.unsqueeze(1) * mask.to(adv.dtype)


def reward_to_go(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = sum_{s >= t} gamma^(s-t) r_s over valid tokens, ``[B, T]`` (reverse scan over T)."""
    m = mask.to(rewards.dtype)
    if gamma == 1.0 and bool((m[:, 1:] <= m[:, :-1]).all()):
        # undiscounted, right-padded rows: a reverse cumulative sum, no loop over time
        return (rewards * m).flip(1).cumsum(1).flip(1) * m
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):  # loop over time, vectorised over batch
        running = rewards[:, t] + gamma * running * (m[:, t + 1] if t + 1 < m.shape[1] else 0.0)
        out[:, t] = running * m[:, t]
    return out


def group_normalize(x: Tensor, group_ids: Tensor | None, scale_by_std: bool, eps: float) -> Tensor:
    """``x - mean_g(x)``, divided by ``std_g(x) + eps`` when ``scale_by_std`` (GRPO's
    normalisation of any per-response score ``[B]``); equal scores give exactly 0."""
    s = group_stats(x, group_ids)
    adv = x - s.mean
    return adv / (s.std + eps) if scale_by_std else adv


def _metrics(adv: Tensor, rewards: Tensor) -> dict[str, float]:
    return {"reward_mean": rewards.mean().item(), "adv_abs_mean": adv.abs().mean().item()}


@dataclass(frozen=True)
class GRPOParams:
    scale_by_std: bool = True  # False: Dr. GRPO's unscaled r - mean
    eps: float = 1e-6


@ADVANTAGES.register("grpo", GRPOParams)
def grpo(inp: AdvantageInput, p: GRPOParams) -> AdvantageOutput:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)   with std the unbiased group std and
    r_i the outcome plus any in-reward token penalties summed over the response,
    or A_i = r_i - mean_g(r) when ``scale_by_std=False`` (Dr. GRPO, Liu et al. 2025,
    arXiv:2503.20783, which drops the std to remove the question-difficulty bias).
    A group with identical rewards has r_i - mean = 0 exactly, so A = 0 (no NaN).
    """
    r = response_rewards(inp)
    adv = group_normalize(r, inp.group_ids, p.scale_by_std, p.eps)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@ADVANTAGES.register("rloo", NoParams)
def rloo(inp: AdvantageInput, p: NoParams) -> AdvantageOutput:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = r_i - (1/(n-1)) sum_{j != i} r_j = n/(n-1) * (r_i - mean_g(r)),  n = group size;
    a singleton group (n = 1) has no baseline sample and gets A = 0.
    """
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    adv = torch.where(s.count > 1, s.count / (s.count - 1).clamp_min(1) * (r - s.mean), 0.0 * r)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@dataclass(frozen=True)
class ReinforcePPParams:
    subtract_group_mean: bool = False  # True: "REINFORCE++-baseline" (group mean first)
    gamma: float = 1.0
    eps: float = 1e-8


@ADVANTAGES.register("reinforce_pp", ReinforcePPParams)
def reinforce_pp(inp: AdvantageInput, p: ReinforcePPParams) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): critic-free, *batch*-normalised advantage.

    Per token, the return G_t = sum_{s>=t} gamma^(s-t) r_s of the dense reward (outcome at
    the last token + ``token_rewards`` such as -beta*KL), optionally minus the group mean
    outcome (REINFORCE++-baseline), then whitened over all valid tokens of the batch:
    A = (G - mean_batch(G)) / (std_batch(G) + eps). Without a mask: the same on ``[B]``.
    """
    r = scalarize_rewards(inp)
    if p.subtract_group_mean:
        r = r - group_stats(r, inp.group_ids).mean
    if inp.mask is None:
        return AdvantageOutput(masked_whiten(r, None, eps=p.eps), metrics=_metrics(r, r))
    shifted = AdvantageInput(r, inp.group_ids, inp.mask, token_rewards=inp.token_rewards)
    returns = reward_to_go(token_reward_matrix(shifted), inp.mask, p.gamma)
    adv = masked_whiten(returns, inp.mask, eps=p.eps)
    return AdvantageOutput(adv, returns=returns, metrics=_metrics(adv, r))


@dataclass(frozen=True)
class GAEParams:
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True


@ADVANTAGES.register("gae", GAEParams)
def gae(inp: AdvantageInput, p: GAEParams) -> AdvantageOutput:
    """Generalised advantage estimation for PPO with a critic (Schulman et al. 2016).

    delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t
    A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1},     returns_t = A_t + V_t
    with r_t the dense reward (outcome on the last valid token + ``token_rewards``) and
    m the mask (V past the last valid token is 0). Optionally whitened over valid tokens.
    Needs ``mask`` and ``values`` ``[B, T]``.
    """
    if inp.mask is None or inp.values is None:
        raise ValueError("gae needs AdvantageInput.mask and AdvantageInput.values ([B, T])")
    m = inp.mask.float()
    v = inp.values.float().detach() * m
    r = token_reward_matrix(inp)
    B, T = m.shape
    next_v = torch.cat([v[:, 1:], v.new_zeros(B, 1)], dim=1)
    next_m = torch.cat([m[:, 1:], m.new_zeros(B, 1)], dim=1)
    delta = r + p.gamma * next_v * next_m - v
    adv = torch.zeros_like(v)
    running = v.new_zeros(B)
    for t in range(T - 1, -1, -1):  # loop over time, vectorised over batch
        running = delta[:, t] + p.gamma * p.lam * next_m[:, t] * running
        adv[:, t] = running
    adv = adv * m
    returns = (adv + v) * m
    if p.whiten:
        adv = masked_whiten(adv, m)
    return AdvantageOutput(adv, returns=returns, metrics=_metrics(adv, scalarize_rewards(inp)))


@dataclass(frozen=True)
class RiVERParams:
    other_credit: float = 0.5  # upper bound of the credit of non-top solutions, in [0, 1)

    def __post_init__(self) -> None:
        if not 0.0 <= self.other_credit < 1.0:
            raise ValueError(f"other_credit must be in [0, 1), got {self.other_credit}")


@ADVANTAGES.register("river", RiVERParams)
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


@ADVANTAGES.register("hmpo", HMPOParams)
def hmpo(inp: AdvantageInput, p: HMPOParams) -> AdvantageOutput:
    """HMPO median-length token-efficiency shaping (Mach-Mind-4-Flash, catalog 004-11b).

    Among the *correct* responses of a group (reward > 0), length is compared with their
    (lower) median length m_g; the reward is shaped before the GRPO normalisation:

        r'_i = r_i + alpha * 1[correct_i] * clip((m_g - |y_i|) / m_g, -1, 1)

    Shorter-than-median correct responses gain, longer ones lose, wrong ones are unchanged.
    With binary rewards and alpha < 0.5 every correct response still scores above every
    wrong one (r' in [1 - alpha, 1 + alpha] vs 0), so the shaping trades length only within
    the correct set (the accuracy-preserving part). Single stage: no separate compression
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
    shaped = r + bonus
    adv = group_normalize(shaped, inp.group_ids, p.scale_by_std, p.eps)
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


@ADVANTAGES.register("icr", ICRParams)
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
    s_len, s_cor = group_stats(lengths, inp.group_ids), group_stats(correct, inp.group_ids)
    g, G = s_len.index, int(s_len.index.max()) + 1
    cov = group_sum((lengths - s_len.mean) * (correct - s_cor.mean), inp.group_ids)
    rho = cov / ((s_len.count - 1).clamp_min(1) * s_len.std * s_cor.std).clamp_min(1e-12)
    rho = torch.where((s_len.std > 0) & (s_cor.std > 0), rho, torch.zeros_like(rho))
    big = torch.finfo(lengths.dtype).max
    shortest = lengths.new_full((G,), big).scatter_reduce(
        0, g, torch.where(correct > 0, lengths, big), reduce="amin"
    )[g]
    target = (correct > 0) & (lengths == shortest) & (rho < 0)
    adv = adv + p.coef * target.float()
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={
            **base.metrics,
            "icr_active_frac": float((rho < 0).float().mean()),
            "icr_targets": float(target.sum()),
        },
    )


@dataclass(frozen=True)
class SoftPairParams:
    scale_by_std: bool = False  # optionally GRPO-normalise the pairwise rewards
    eps: float = 1e-6


@ADVANTAGES.register("soft_pair_grpo", SoftPairParams)
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
class BASISParams:
    ridge: float | None = None  # lambda of the ridge regression; None: chosen by LOO error
    normalize_features: bool = True  # L2-normalise each feature row first
    whiten: bool = False  # additionally batch-whiten the advantages (REINFORCE++-style)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.ridge is not None and self.ridge <= 0:
            raise ValueError(f"ridge must be > 0 (or None for automatic), got {self.ridge}")


RIDGE_GRID = tuple(10.0**e for e in range(-3, 7))  # 1e-3 .. 1e6 (1e6 ~ the batch mean)


def loo_ridge_values(
    rewards: Tensor, features: Tensor | None, ridge: float | None
) -> tuple[Tensor, float]:
    """Leave-one-out ridge predictions ``[B]`` of each reward from the *other* prompts.

    Kernel form: X = [c 1, F] (an intercept column with c = 1e3, so the intercept is
    practically unpenalised), K = X X^T = V diag(s) V^T, hat matrix
    H = V diag(s / (s + lambda)) V^T, and the exact leave-one-out prediction
    (yhat_i - H_ii y_i) / (1 - H_ii). ``ridge=None`` picks lambda on :data:`RIDGE_GRID` by
    the mean squared leave-one-out error (one eigendecomposition, O(B^2) per lambda); a
    large lambda falls back to the leave-one-out batch mean when the features carry no
    signal. Without features it is the leave-one-out batch mean. Returns (values, lambda).
    """
    y = rewards.to(torch.float64)
    B = y.numel()
    if B < 2:
        return torch.zeros_like(rewards), float("nan")
    cols = [y.new_full((B, 1), 1e3)]
    if features is not None:
        cols.append(features.to(torch.float64))
    X = torch.cat(cols, 1)
    s, V = torch.linalg.eigh(X @ X.T)
    s = torch.where(s > 1e-12 * s.max(), s, torch.zeros_like(s))  # rounding-level -> 0
    Vy = V.T @ y
    best: tuple[float, Tensor, float] | None = None
    for lam in RIDGE_GRID if ridge is None else (ridge,):
        shrink = s / (s + lam)
        yhat = V @ (shrink * Vy)
        h = ((V**2) @ shrink).clamp(max=1 - 1e-9)
        loo = (yhat - h * y) / (1 - h)
        err = float(((loo - y) ** 2).mean())
        if best is None or err < best[0]:
            best = (err, loo, lam)
    assert best is not None
    return best[1].to(rewards.dtype), best[2]


@ADVANTAGES.register("basis", BASISParams)
def basis(inp: AdvantageInput, p: BASISParams) -> AdvantageOutput:
    """BASIS: one rollout per prompt, a value baseline pooled across the batch (catalog 000-02).

    Critic-free: the value of prompt i is predicted from the *other* prompts of the batch
    by ridge regression of their rewards on prompt features (``features`` ``[B, D]``, e.g.
    the policy's mean-pooled prompt hidden state), evaluated leave-one-out so the baseline
    never sees r_i (the gradient stays unbiased; with ``ridge=None`` the one shared
    lambda is picked by the batch's leave-one-out error, a weak dependence we accept):

        V_i = LOO-ridge(r_{-i} ~ [1, f_{-i}])(f_i),      A_i = r_i - V_i

    Without features V_i is the leave-one-out batch mean (REINFORCE with a batch baseline).
    ``whiten`` additionally standardises A over the batch as REINFORCE++ does. The
    abstract states the aim (pool information across prompts with one rollout each); the
    leave-one-out ridge regression on prompt features is our reading. Metric
    ``value_fit_r2``: the fraction of reward variance the baseline explains.
    """
    r = response_rewards(inp)
    f = inp.features
    if f is not None and p.normalize_features:
        f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
    v, lam = loo_ridge_values(r, f, p.ridge)
    adv = r - v
    if p.whiten:
        adv = masked_whiten(adv, None, eps=p.eps)
    var = r.var(unbiased=False).clamp_min(1e-12)
    r2 = 1.0 - ((r - v) ** 2).mean() / var
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={**_metrics(adv, r), "value_fit_r2": r2.item(), "basis_ridge": lam},
    )


@dataclass(frozen=True)
class GCPOParams:
    w_min: float = 0.25  # clip range of the weights
    w_max: float = 4.0
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0 < self.w_min <= 1 <= self.w_max:
            raise ValueError(f"need 0 < w_min <= 1 <= w_max, got {self.w_min}, {self.w_max}")


def semantic_disagreement(features: Tensor, group_ids: Tensor | None) -> Tensor:
    """u_i = 1 - cos(e_i, mean direction of i's group), ``[B]`` in [0, 2].

    Geometry-aware uncertainty: it measures how far a response's embedding points from
    its group's consensus direction (unit vectors, so the embedding norm, the anisotropic
    part a token-entropy measure mixes in, plays no role).
    """
    e = features.float() / features.float().norm(dim=1, keepdim=True).clamp_min(1e-12)
    centre = group_sum(e, group_ids)  # [B, D]: sum of the unit vectors of i's group
    centre = centre / centre.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return 1.0 - (e * centre).sum(1)


@ADVANTAGES.register("gcpo", GCPOParams)
def gcpo(inp: AdvantageInput, p: GCPOParams) -> AdvantageOutput:
    """GCPO, geometry-aware calibrated uncertainty weighting of GRPO (catalog 000-10).

    1. Geometry-aware uncertainty u_i = :func:`semantic_disagreement` of the response
       embeddings (``features`` ``[B, D]``).
    2. Reward-based calibration: regress the learning-signal strength of each response's
       group (its reward std s_g) on u over the batch by least squares; the calibrated
       uncertainty is the prediction c_i = a + b u_i, i.e. uncertainty expressed as
       expected signal strength (b < 0 when disagreement turns out to mark noise).
    3. A_i = w_i A_i^GRPO with w_i = clip(c_i / mean(c), w_min, w_max), monotone in c.

    If u is constant over the batch, b = 0, c is constant and w = 1: exactly GRPO. The
    abstract names the ingredients (semantic disagreement, reward calibration, regulating
    gradient variance); the regression-based calibration and ratio weights are our reading.
    """
    if inp.features is None:
        raise ValueError("gcpo needs AdvantageInput.features (response embeddings [B, D])")
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    a = (r - s.mean) / (s.std + p.eps) if p.scale_by_std else r - s.mean  # GRPO
    u = semantic_disagreement(inp.features, inp.group_ids).double()
    signal = s.std.double()
    du = u - u.mean()
    var_u = (du**2).mean()
    slope = torch.where(var_u > 1e-12, (du * (signal - signal.mean())).mean() / var_u, 0.0 * var_u)
    c = (signal.mean() + slope * du).clamp_min(1e-6)
    w = (c / c.mean()).clamp(p.w_min, p.w_max).float()
    adv = w * a
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={
            **_metrics(adv, r),
            "gcpo_calibration_slope": float(slope),
            "gcpo_weight_min": w.min().item(),
            "gcpo_weight_max": w.max().item(),
        },
    )


@dataclass(frozen=True)
class EDGRPOParams:
    alpha: float = 0.05  # weight of the self-information bonus (advantage units per nat)
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")


@ADVANTAGES.register("ed_grpo", EDGRPOParams)
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
