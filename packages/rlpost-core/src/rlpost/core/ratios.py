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
the sampled tokens, detached), all ``[B, T]``; ``mask`` ``[B, T]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from rlpost.core.masked import masked_mean, masked_sum
from rlpost.core.registry import NoParams, Registry


@dataclass(frozen=True)
class RatioInput:
    logp: Tensor
    old_logp: Tensor
    mask: Tensor
    rollout_logp: Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("old_logp", "mask", "rollout_logp"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logp.shape:
                raise ValueError(
                    f"{name} shape {tuple(t.shape)} != logp shape {tuple(self.logp.shape)}"
                )
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be [B, T], got {tuple(self.logp.shape)}")


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
    lr = (inp.logp - inp.old_logp.detach()) * m
    return RatioOutput(lr, {"ratio_mean": masked_mean(lr.detach().exp(), m).item()})


@RATIOS.register("sequence", NoParams)
def sequence_ratio(inp: RatioInput, p: NoParams) -> RatioOutput:
    """GSPO length-normalised sequence ratio (Zheng et al. 2025, arXiv:2507.18071).

    log s_i = (1/|y_i|) sum_t (log pi - log pi_old), broadcast to every valid token of
    response i, so a token-level clip acts on the sequence ratio and a
    ``seq_mean_token_mean`` aggregation gives GSPO's per-sequence objective exactly.
    grad log s_i = (1/|y_i|) sum_t grad log pi(y_t).
    """
    m = inp.mask.float()
    seq = masked_sum(inp.logp - inp.old_logp.detach(), m, dim=1) / m.sum(1).clamp_min(1.0)
    lr = seq.unsqueeze(1) * m
    return RatioOutput(lr, {"ratio_mean": seq.detach().exp().mean().item()})


def _engine_log_ratio(inp: RatioInput, level: str) -> tuple[Tensor, Tensor]:
    """log(pi_old / pi_rollout), token-level ``[B, T]`` or summed per sequence and broadcast."""
    if inp.rollout_logp is None:
        raise ValueError("this correction needs RatioInput.rollout_logp (rollout-engine log-probs)")
    m = inp.mask.float()
    lr = (inp.old_logp - inp.rollout_logp).detach() * m
    if level == "sequence":
        lr = masked_sum(lr, m, dim=1).unsqueeze(1) * m
    return lr, m


@dataclass(frozen=True)
class TISParams:
    cap: float = 2.0
    level: Literal["token", "sequence"] = "token"

    def __post_init__(self) -> None:
        if self.cap <= 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")


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
    w = lr.exp().clamp(max=p.cap) * m
    return CorrectionOutput(
        w,
        m.clone(),
        {
            "is_weight_mean": masked_mean(w, m).item(),
            "is_truncated_frac": masked_mean((lr.exp() > p.cap).float(), m).item(),
        },
    )


@CORRECTIONS.register("mis", TISParams)
def masked_is(inp: RatioInput, p: TISParams) -> CorrectionOutput:
    """Masked importance sampling (token or sequence level; same paper family as TIS).

    Tokens (or whole sequences) whose engine ratio pi_old / pi_rollout lies outside
    [1/C, C] are dropped from the loss (mask 0); kept ones get weight w = the ratio.
    """
    lr, m = _engine_log_ratio(inp, p.level)
    ratio = lr.exp()
    keep = ((ratio <= p.cap) & (ratio >= 1.0 / p.cap)).float() * m
    return CorrectionOutput(
        ratio * keep, keep, {"is_masked_frac": 1.0 - masked_mean(keep, m).item()}
    )
