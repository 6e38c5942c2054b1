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
ratio or weight is exponentiated with :func:`~rlpost.core.numerics.safe_ratio` (log-ratio
clamped at ``LOG_RATIO_MAX``), so it cannot overflow to ``inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.masked import masked_sum
from rlpost.core.registry import Registry


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


_RATIO_INPUTS = {
    Input.ROLLOUT_LOGPROBS: ("rollout_logp",),
    Input.ADVANTAGES: ("advantages",),
    Input.TOKEN_DISTS: ("dists",),
}
RATIOS: Registry[RatioInput, RatioOutput] = Registry(
    "policy ratio", RatioInput, RatioOutput, inputs=_RATIO_INPUTS, gated=_RATIO_INPUTS
)
CORRECTIONS: Registry[RatioInput, CorrectionOutput] = Registry(
    "importance correction",
    RatioInput,
    CorrectionOutput,
    inputs=_RATIO_INPUTS,
    gated=_RATIO_INPUTS,
)


def _engine_log_ratio(inp: RatioInput, level: str) -> tuple[Tensor, Tensor]:
    """log(pi_old / pi_rollout), token-level ``[B, T]`` or summed per sequence and broadcast."""
    if inp.rollout_logp is None:
        raise ValueError("this correction needs RatioInput.rollout_logp (rollout-engine log-probs)")
    m = inp.mask.float()
    lr = _token_log_ratio(inp.old_logp.detach(), inp.rollout_logp.detach(), m)
    if level == "sequence":
        lr = masked_sum(lr, m, dim=1).unsqueeze(1) * m
    return lr, m
