"""Policy ratios and rollout-engine importance corrections.

Two registries, because a recipe chooses them independently (GSPO's sequence ratio is
routinely combined with a truncated-IS rollout correction):

* ``RATIOS`` — the *policy* ratio the objective clips: ``fn(RatioInput, params) ->
  RatioOutput`` with a differentiable ``log_ratio`` ``[B, T]``.
* ``CORRECTIONS`` — detached importance weights and masks that correct for the rollout
  engine (vLLM, HF generate) sampling from a slightly different distribution than the
  trainer computes (different kernels, precision): ``fn(RatioInput, params) ->
  CorrectionOutput`` with ``weights`` and ``mask`` ``[B, T]``.

Log-probs: ``logp`` (current policy, differentiable), ``old_logp`` (trainer's log-probs of
the behaviour policy, detached), ``rollout_logp`` (the rollout engine's own log-probs of
the sampled tokens, detached), all ``[B, T]``; ``mask`` ``[B, T]``. Masked tokens are never
read (``torch.where``), so ``-inf`` padding cannot leak a NaN into valid tokens, and every
ratio or weight is exponentiated with :func:`~rlpost.core.objectives.safe_ratio` (log-ratio
clamped at ``LOG_RATIO_MAX``), so it cannot overflow to ``inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from rlpost.core.masked import masked_mean, masked_sum
from rlpost.core.objectives import (
    LOG_RATIO_MAX,
    OBJECTIVES,
    ObjectiveInput,
    ObjectiveOutput,
    clipped_surrogate,
    safe_ratio,
)
from rlpost.core.registry import NoParams, Registry


def _check_finite(params: object, *names: str) -> None:
    for name in names:
        v = getattr(params, name)
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{type(params).__name__}.{name} must be finite, got {v}")


def _check_choice(params: object, name: str, valid: tuple[str, ...]) -> None:
    v = getattr(params, name)
    if v not in valid:
        raise ValueError(f"{type(params).__name__}.{name} must be one of {valid}, got {v!r}")


def _token_log_ratio(logp: Tensor, other: Tensor, mask: Tensor) -> Tensor:
    """``logp - other`` on valid tokens, exactly 0 (never computed from) on masked ones."""
    return torch.where(mask > 0, logp - other, torch.zeros_like(logp))


@dataclass(frozen=True)
class RatioInput:
    logp: Tensor
    old_logp: Tensor
    mask: Tensor
    rollout_logp: Tensor | None = None
    # optional, read by the entries that need them (None elsewhere): advantages [B] or
    # [B, T] (sign of the next policy-gradient step) and per-token distributions over K
    # vocabulary ids (see TokenDistributions; predictive_divergence_mask)
    advantages: Tensor | None = None
    dists: TokenDistributions | None = None

    def __post_init__(self) -> None:
        for name in ("old_logp", "mask", "rollout_logp"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logp.shape:
                raise ValueError(
                    f"{name} shape {tuple(t.shape)} != logp shape {tuple(self.logp.shape)}"
                )
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be [B, T], got {tuple(self.logp.shape)}")
        a = self.advantages
        if a is not None and a.shape not in (self.logp.shape, self.logp.shape[:1]):
            raise ValueError(f"advantages must be [B] or [B, T], got {tuple(a.shape)}")
        if self.dists is not None and self.dists.logp.shape[:2] != self.logp.shape:
            raise ValueError(
                f"dists must be [B, T, K] with [B, T] = {tuple(self.logp.shape)}, "
                f"got {tuple(self.dists.logp.shape)}"
            )


@dataclass(frozen=True)
class TokenDistributions:
    """Per-token log-probs of both policies over K vocabulary ids (``RatioInput.dists``).

    ``logp`` ``[B, T, K]``: the current (training) policy's log-probs of the K ids;
    ``old_logp`` ``[B, T, K]``: the behaviour policy's log-probs of the same ids (e.g. the
    rollout engine's top-K); ``sampled_index`` ``[B, T]`` long: column of the sampled token
    among the K, or -1 when it is not among them. Full distributions: K = V, the ids are the
    vocabulary and ``sampled_index`` is the sampled token (``from_logits``). Read detached.
    """

    logp: Tensor
    old_logp: Tensor
    sampled_index: Tensor

    def __post_init__(self) -> None:
        if self.logp.dim() != 3:
            raise ValueError(f"dists.logp must be [B, T, K], got {tuple(self.logp.shape)}")
        if self.old_logp.shape != self.logp.shape:
            raise ValueError(
                f"dists.old_logp shape {tuple(self.old_logp.shape)} != "
                f"dists.logp shape {tuple(self.logp.shape)}"
            )
        if self.sampled_index.shape != self.logp.shape[:2]:
            raise ValueError(
                f"dists.sampled_index must be [B, T] = {tuple(self.logp.shape[:2])}, "
                f"got {tuple(self.sampled_index.shape)}"
            )
        if self.sampled_index.dtype.is_floating_point:
            raise ValueError("dists.sampled_index must be an integer tensor")
        k = self.logp.shape[-1]
        if (
            self.sampled_index.numel()
            and not ((self.sampled_index >= -1) & (self.sampled_index < k)).all()
        ):
            lo, hi = self.sampled_index.min().item(), self.sampled_index.max().item()
            raise ValueError(
                f"dists.sampled_index must be in [-1, K) with K = {k} (-1: sampled token not "
                f"among the K ids), got values in [{lo}, {hi}]"
            )

    @classmethod
    def from_logits(cls, logits: Tensor, old_logits: Tensor, tokens: Tensor) -> TokenDistributions:
        """Full distributions from ``[B, T, V]`` logits of both policies and ``[B, T]`` tokens."""

        def logsm(x: Tensor) -> Tensor:  # float32 at least, float64 kept
            x = x.detach()
            return (x if x.dtype == torch.float64 else x.float()).log_softmax(-1)

        return cls(logsm(logits), logsm(old_logits), tokens.long())


@dataclass(frozen=True)
class RatioOutput:
    log_ratio: Tensor  # [B, T], differentiable w.r.t. logp; 0 on masked tokens
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CorrectionOutput:
    weights: Tensor  # [B, T] detached multiplicative weights (1 = no correction)
    mask: Tensor  # [B, T] float; tokens the correction rejects are 0
    metrics: dict[str, float] = field(default_factory=dict)


RATIOS: Registry[RatioInput, RatioOutput] = Registry("policy ratio", RatioInput, RatioOutput)
CORRECTIONS: Registry[RatioInput, CorrectionOutput] = Registry(
    "importance correction", RatioInput, CorrectionOutput
)


@RATIOS.register("token", NoParams)
def token_ratio(inp: RatioInput, p: NoParams) -> RatioOutput:
    """PPO token ratio: log r_t = log pi(y_t|x, y_<t) - log pi_old(y_t|x, y_<t)."""
    m = inp.mask.float()
    lr = _token_log_ratio(inp.logp, inp.old_logp.detach(), m)
    return RatioOutput(lr, {"ratio_mean": masked_mean(safe_ratio(lr.detach()), m).item()})


@RATIOS.register("sequence", NoParams)
def sequence_ratio(inp: RatioInput, p: NoParams) -> RatioOutput:
    """GSPO length-normalised sequence ratio (Zheng et al. 2025, arXiv:2507.18071).

    log s_i = (1/|y_i|) sum_t (log pi - log pi_old), broadcast to every valid token of
    response i, so a token-level clip acts on the sequence ratio and a
    ``seq_mean_token_mean`` aggregation gives GSPO's per-sequence objective exactly.
    grad log s_i = (1/|y_i|) sum_t grad log pi(y_t).
    """
    m = inp.mask.float()
    seq = masked_mean(_token_log_ratio(inp.logp, inp.old_logp.detach(), m), m, dim=1)
    lr = seq.unsqueeze(1) * m
    return RatioOutput(lr, {"ratio_mean": safe_ratio(seq.detach()).mean().item()})


def _engine_log_ratio(inp: RatioInput, level: str) -> tuple[Tensor, Tensor]:
    """log(pi_old / pi_rollout), token-level ``[B, T]`` or summed per sequence and broadcast."""
    if inp.rollout_logp is None:
        raise ValueError("this correction needs RatioInput.rollout_logp (rollout-engine log-probs)")
    m = inp.mask.float()
    lr = _token_log_ratio(inp.old_logp.detach(), inp.rollout_logp.detach(), m)
    if level == "sequence":
        lr = masked_sum(lr, m, dim=1).unsqueeze(1) * m
    return lr, m


@dataclass(frozen=True)
class TISParams:
    cap: float = 2.0
    level: Literal["token", "sequence"] = "token"

    def __post_init__(self) -> None:
        _check_finite(self, "cap")
        if self.cap <= 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")
        _check_choice(self, "level", ("token", "sequence"))


@CORRECTIONS.register("none", NoParams)
def no_correction(inp: RatioInput, p: NoParams) -> CorrectionOutput:
    """No rollout correction: weights 1, mask unchanged."""
    m = inp.mask.float()
    return CorrectionOutput(m.clone(), m.clone())


@CORRECTIONS.register("tis", TISParams)
def truncated_is(inp: RatioInput, p: TISParams) -> CorrectionOutput:
    """Truncated importance sampling between rollout engine and trainer
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").

    w = min(pi_old / pi_rollout, C), per token or per sequence (product over the tokens).
    When the engines agree (rollout_logp == old_logp), w = 1 exactly.
    """
    lr, m = _engine_log_ratio(inp, p.level)
    rho = safe_ratio(lr)
    w = rho.clamp(max=p.cap) * m
    return CorrectionOutput(
        w,
        m.clone(),
        {
            "is_weight_mean": masked_mean(w, m).item(),
            "is_truncated_frac": masked_mean((rho > p.cap).float(), m).item(),
        },
    )


@CORRECTIONS.register("mis", TISParams)
def masked_is(inp: RatioInput, p: TISParams) -> CorrectionOutput:
    """Masked importance sampling (token or sequence level; same paper family as TIS).

    Tokens (or whole sequences) whose engine ratio pi_old / pi_rollout lies outside
    [1/C, C] are dropped from the loss (mask 0); kept ones get weight w = the ratio.
    """
    lr, m = _engine_log_ratio(inp, p.level)
    ratio = safe_ratio(lr)
    keep = ((ratio <= p.cap) & (ratio >= 1.0 / p.cap)).float() * m
    return CorrectionOutput(
        ratio * keep, keep, {"is_masked_frac": 1.0 - masked_mean(keep, m).item()}
    )


# --- F-TIS (catalog 000-09) -------------------------------------------------------------


@dataclass(frozen=True)
class FTISParams:
    cap: float = 2.0  # truncation C of the token weight
    filter_low: float = 0.2  # drop samples whose engine ratio falls below this
    filter_level: Literal["token", "sequence"] = "sequence"

    def __post_init__(self) -> None:
        _check_finite(self, "cap", "filter_low")
        if self.cap < 1:
            raise ValueError(f"cap must be >= 1 (weight 1 must stay reachable), got {self.cap}")
        if not 0 <= self.filter_low <= 1:
            raise ValueError(f"filter_low must be in [0, 1], got {self.filter_low}")
        _check_choice(self, "filter_level", ("token", "sequence"))


@CORRECTIONS.register("ftis", FTISParams)
def filtered_truncated_is(inp: RatioInput, p: FTISParams) -> CorrectionOutput:
    """F-TIS: filtered truncated importance sampling for samples from heterogeneous models
    (catalog 000-09).

    ``rollout_logp`` ``[B, T]``: log-probs of the model that generated the sample (another
    participant's model, or the local engine); ``old_logp``: the local trainer's.
    rho_t = pi_local(y_t) / pi_gen(y_t).

        filter:   keep_i = 1[ exp(mean_t log rho_t) >= f ]        (``filter_level="sequence"``)
                  keep_t = 1[ rho_t >= f ]                         (``"token"``)
        truncate: w_t = keep * min(rho_t, C)

    Filtered tokens leave the loss (mask 0, weight 0); kept ones are truncated at C. Our
    reading of the abstract (which gives no formula): the filter removes samples the local
    model finds implausible (a low geometric-mean ratio), truncation bounds the rest; a
    sample the local model generated itself has rho = 1 and passes unchanged.
    """
    lr, m = _engine_log_ratio(inp, "token")
    if p.filter_level == "sequence":
        seq = masked_mean(lr, m, dim=1)
        keep = (safe_ratio(seq.unsqueeze(1)) >= p.filter_low).float() * m
    else:
        keep = (safe_ratio(lr) >= p.filter_low).float() * m
    rho = safe_ratio(lr)
    w = rho.clamp(max=p.cap) * keep
    return CorrectionOutput(
        w,
        keep,
        {
            "ftis_filtered_frac": 1.0 - masked_mean(keep, m).item(),
            "ftis_truncated_frac": masked_mean((rho > p.cap).float(), keep).item(),
            "is_weight_mean": masked_mean(w, keep).item(),
        },
    )


# --- CTPO (catalog 001-09) --------------------------------------------------------------


@dataclass(frozen=True)
class CumulativeParams:
    detach_prefix: bool = True  # gradient of term t only through log pi(y_t)


@RATIOS.register("cumulative", CumulativeParams)
def cumulative_ratio(inp: RatioInput, p: CumulativeParams) -> RatioOutput:
    """CTPO cumulative token IS ratio (catalog 001-09): the prefix product of token ratios.

        log R_t = sum_{s <= t, m_s = 1} (log pi(y_s) - log pi_old(y_s)),   R_t = prod r_s

    over the valid tokens up to t (masked tokens, e.g. tool outputs, are skipped), ``[B, T]``.
    ``detach_prefix=True`` (default, the token-level policy-gradient reading): the value
    is R_t but term t's gradient flows through log pi(y_t) only,
    log R_t = sg(sum_{s<t} ...) + (log pi(y_t) - log pi_old(y_t)), so the surrogate R_t A
    gives the prefix-corrected term R_t A grad log pi(y_t). ``False``: the full gradient
    of the product (R_t A sum_{s<=t} grad log pi(y_s)).
    """
    m = inp.mask.float()
    tok = _token_log_ratio(inp.logp, inp.old_logp.detach(), m)
    csum = tok.cumsum(1)
    lr = (csum.detach() - tok.detach() + tok) if p.detach_prefix else csum
    lr = lr * m
    return RatioOutput(
        lr,
        {
            "ratio_mean": masked_mean(safe_ratio(lr.detach()), m).item(),
            "log_ratio_abs_max": (lr.detach().abs() * m).max().item() if m.numel() else 0.0,
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


# --- SIS (catalog 004-17) ---------------------------------------------------------------


@dataclass(frozen=True)
class SISParams:
    envelope: float = 2.0  # M > 1: acceptance probability min(1, rho) / M
    rejected_weight: Literal["unbiased", "ratio"] = "unbiased"
    # None: the global torch RNG (seed it per step in the trainer). An int: for tests and
    # reproducibility; the draw is seeded by (seed, a checksum of the call's log-probs), so
    # it is reproducible for the same inputs yet fresh on every new batch / policy update
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_finite(self, "envelope")
        if self.envelope <= 1:
            raise ValueError(f"envelope must be > 1, got {self.envelope}")
        _check_choice(self, "rejected_weight", ("unbiased", "ratio"))


def _call_seed(seed: int, *xs: Tensor) -> int:
    """``seed`` mixed with a checksum of the tensors (deterministic for equal inputs)."""
    h = seed & 0xFFFFFFFF
    for x in xs:
        c = torch.nan_to_num(x.detach().double(), nan=0.0, posinf=0.0, neginf=0.0)
        ramp = torch.arange(1, c.numel() + 1, dtype=c.dtype, device=c.device) % 997
        h = (h * 1_000_003 + int(((c.flatten() * (ramp + 1)).sum().item() * 1e6) % 2**31)) % 2**61
    return h


@CORRECTIONS.register("sis", SISParams)
def selective_is(inp: RatioInput, p: SISParams) -> CorrectionOutput:
    """SIS: selective importance sampling by a token-level rejection test (catalog 004-17).

    Target: the current policy pi (``logp``, read detached); proposal q: the policy that
    sampled the tokens (``rollout_logp``, else ``old_logp``); rho_t = pi(y_t) / q(y_t).

        a_t = min(1, rho_t) / M,   u_t ~ U(0, 1)
        accepted (u_t < a_t):  w_t = 1                 (viewed as on-policy)
        rejected:              w_t = (rho_t - a_t) / (1 - a_t)    (``"unbiased"``)
                               w_t = rho_t                        (``"ratio"``)

    ``"unbiased"``: the rejected tokens keep an IS weight, rescaled so that the accepted
    tokens' unit weights are paid for: E[w | y] = a + (1 - a) w_rej = rho(y) exactly, hence
    E_q[w] = 1 and an unbiased gradient; rho < 1: w_rej = rho (M - 1) / (M - rho) <= rho,
    rho >= 1: w_rej = (M rho - 1) / (M - 1) <= rho M / (M - 1). The rejected weight is
    thus at most M / (M - 1) times the plain IS weight rho but, like rho, grows linearly
    in rho (not bounded in absolute terms: truncate with a ``tis`` cap upstream if the
    ratios can be large; rho is formed with ``safe_ratio``, so it is finite). ``"ratio"`` is the
    abstract's literal "rejected tokens retain the standard IS weight"; it is biased
    (E[w | y] = a + (1 - a) rho). The weights replace the policy ratio: pair the entry
    with an objective whose gradient is w A grad log pi (``reinforce``, preset ``sis``).
    M is ours: the abstract gives no acceptance rule; a_t = min(1, rho) is the
    Metropolis test, divided by M so that tokens with rho >= 1 can be rejected too.
    ``seed``: None draws u from the global torch RNG; an int seeds a generator with
    (seed, checksum of ``logp`` and the proposal log-probs), so a fixed seed reproduces a
    call on the same inputs but does not reuse one set of uniforms across steps.
    """
    m = inp.mask.float()
    q = inp.rollout_logp if inp.rollout_logp is not None else inp.old_logp
    rho = safe_ratio(_token_log_ratio(inp.logp.detach(), q.detach(), m))
    a = rho.clamp(max=1.0) / p.envelope
    if p.seed is None:
        u = torch.rand(rho.shape, device=rho.device)
    else:
        lp_valid = _token_log_ratio(inp.logp, torch.zeros_like(inp.logp), m)
        q_valid = _token_log_ratio(q, torch.zeros_like(q), m)
        g = torch.Generator(device=rho.device).manual_seed(_call_seed(p.seed, lp_valid, q_valid))
        u = torch.rand(rho.shape, generator=g, device=rho.device)
    accept = u < a
    w_rej = (rho - a) / (1.0 - a) if p.rejected_weight == "unbiased" else rho
    w = torch.where(accept, torch.ones_like(rho), w_rej) * m
    return CorrectionOutput(
        w,
        m.clone(),
        {
            "sis_accept_frac": masked_mean(accept.float(), m).item(),
            "is_weight_mean": masked_mean(w, m).item(),
        },
    )


# --- clipped IS + training-inference ratio correction (catalog 004-02) -------------------


@dataclass(frozen=True)
class ClippedISParams:
    low: float = 0.5  # weight clip [low, high] of rho = pi_old(trainer) / pi_rollout(engine)
    high: float = 2.0
    mask_low: float | None = None  # tokens with rho outside [mask_low, mask_high] dropped
    mask_high: float | None = None
    level: Literal["token", "sequence"] = "token"

    def __post_init__(self) -> None:
        if not 0 <= self.low <= 1 <= self.high:
            raise ValueError(f"need 0 <= low <= 1 <= high (rho = 1 kept), got {self}")
        if self.mask_low is not None and not 0 <= self.mask_low <= 1:
            raise ValueError(f"mask_low must be in [0, 1], got {self.mask_low}")
        if self.mask_high is not None and self.mask_high < 1:
            raise ValueError(f"mask_high must be >= 1, got {self.mask_high}")
        _check_choice(self, "level", ("token", "sequence"))


@CORRECTIONS.register("clipped_is", ClippedISParams)
def clipped_is(inp: RatioInput, p: ClippedISParams) -> CorrectionOutput:
    """Two-sided clipped training-inference ratio correction (Ring-2.5-1T-Zero, catalog 004-02).

        rho = pi_old(y_t) / pi_rollout(y_t)   (trainer vs rollout engine; per token, or
                                               the product over the response, ``level``)
        keep = 1[mask_low <= rho <= mask_high]  (each bound optional)
        w = keep * clip(rho, low, high)

    Unlike ``tis`` (one-sided cap) the weight is bounded below too, and the optional band
    masks tokens whose engines disagree too much (``mis`` keeps the unclipped rho). Since
    low <= 1 <= high, w = 1 exactly when the engines agree (rollout_logp == old_logp).
    """
    lr, m = _engine_log_ratio(inp, p.level)
    rho = safe_ratio(lr)
    keep = m.clone()
    if p.mask_low is not None:
        keep = keep * (rho >= p.mask_low).float()
    if p.mask_high is not None:
        keep = keep * (rho <= p.mask_high).float()
    w = rho.clamp(p.low, p.high) * keep
    return CorrectionOutput(
        w,
        keep,
        {
            "is_weight_mean": masked_mean(w, keep).item(),
            "is_clipped_frac": masked_mean(((rho < p.low) | (rho > p.high)).float(), m).item(),
            "is_masked_frac": 1.0 - masked_mean(keep, m).item(),
        },
    )
