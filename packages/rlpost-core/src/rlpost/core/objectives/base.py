"""Policy objectives: per-token loss matrices with detached diagnostics.

Signature: ``fn(ObjectiveInput, params) -> ObjectiveOutput``. The output ``loss`` is a
``[B, T]`` matrix of per-token losses (to be *minimised*), already multiplied by the
importance-correction ``weights`` and zero on masked tokens; reducing it to a scalar is
the aggregation registry's job (:mod:`rlpost.core.aggregation`).

Inputs (``B`` responses, ``T`` tokens):

* ``logp`` ``[B, T]``: log pi_theta of the sampled tokens (differentiable).
* ``old_logp`` ``[B, T]``: log pi_old, the behaviour policy as the trainer computes it.
* ``advantages`` ``[B]`` or ``[B, T]``.
* ``mask`` ``[B, T]``.
* ``log_ratio`` ``[B, T]``: the policy ratio to clip, from :data:`rlpost.core.ratios.RATIOS`
  (defaults to the token ratio ``logp - old_logp``).
* ``weights`` ``[B, T]``: detached rollout-correction weights (default 1).
* ``clip_range`` ``[B, T]``: optional per-token clip half-width (A²TGPO's adaptive
  turn-level clip, ``AdvantageOutput.clip_range``); read by ``ppo_clip_turn``.
* ``group_ids`` ``[B]``: optional integer prompt labels (responses sharing a label were
  sampled for the same prompt); read by the group-level objectives of
  :mod:`rlpost.core.objectives.group` (``conspo``, ``lpo``).
* ``trigger_pos`` ``[B]``: optional integer trigger token index per response (-1: none);
  read by ``mu_grpo``'s negative-advantage veto.
* ``dynamics``: optional :class:`~rlpost.core.advantages.TrainingDynamics` (training
  progress), read by curriculum-scheduled objectives (``conspo``'s margin).

Entries see only the optional inputs they declare at registration (``needs`` / ``reads``,
:mod:`rlpost.core.contract`); the others arrive as ``None``.

Numerics: masked tokens never enter the arithmetic (``torch.where``, so ``-inf`` / NaN
padding in ``logp`` reaches neither the loss nor the gradient), and every ratio is built
with :func:`safe_ratio`, which clamps the log-ratio at :data:`LOG_RATIO_MAX` before
``exp``: a long cumulative or sequence log-ratio cannot overflow to ``inf`` and turn a
discarded branch into a ``0 * inf = NaN`` gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpost.core.advantages.base import TrainingDynamics
from rlpost.core.contract import Input
from rlpost.core.masked import masked_mean
from rlpost.core.numerics import LOG_RATIO_MAX, safe_ratio
from rlpost.core.registry import Registry

__all__ = ["LOG_RATIO_MAX", "safe_ratio"]


@dataclass(frozen=True)
class ObjectiveInput:
    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    log_ratio: Tensor | None = None
    weights: Tensor | None = None
    clip_range: Tensor | None = None
    group_ids: Tensor | None = None  # [B] prompt labels, read by group-level objectives
    trigger_pos: Tensor | None = None  # [B] int trigger token index (-1: none), mu_grpo's veto
    dynamics: TrainingDynamics | None = None  # progress, for curriculum-scheduled objectives

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be [B, T], got {tuple(self.logp.shape)}")
        for name in ("old_logp", "mask", "log_ratio", "weights", "clip_range"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logp.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != logp {tuple(self.logp.shape)}")
        a = self.advantages
        if a.shape not in (self.logp.shape, self.logp.shape[:1]):
            raise ValueError(f"advantages must be [B] or [B, T], got {tuple(a.shape)}")
        for name in ("group_ids", "trigger_pos"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logp.shape[:1]:
                raise ValueError(
                    f"{name} must be [B] {tuple(self.logp.shape[:1])}, got {tuple(t.shape)}"
                )
            if t is not None and (t.is_floating_point() or t.is_complex()):
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")

    @property
    def mask_f(self) -> Tensor:
        return self.mask.float()

    def adv_tokens(self) -> Tensor:
        """Advantages as ``[B, T]`` (detached)."""
        return broadcast_advantages(self.advantages, self.logp)

    def ratio_log(self) -> Tensor:
        """Log-ratio ``[B, T]``, exactly 0 on masked tokens (never read there, so ``-inf``
        padding in ``logp`` / ``old_logp`` gives neither a NaN value nor a NaN gradient)."""
        lr = self.log_ratio if self.log_ratio is not None else self.logp - self.old_logp.detach()
        return torch.where(self.mask > 0, lr, torch.zeros_like(lr))

    def logp_valid(self) -> Tensor:
        """``logp`` with masked tokens replaced by 0 (``-inf`` padding never reaches the loss)."""
        return torch.where(self.mask > 0, self.logp, torch.zeros_like(self.logp))

    def weights_or_ones(self) -> Tensor:
        return torch.ones_like(self.mask_f) if self.weights is None else self.weights.detach()


@dataclass(frozen=True)
class ObjectiveOutput:
    loss: Tensor  # [B, T] per-token loss (weights applied, 0 on masked tokens)
    metrics: dict[str, float] = field(default_factory=dict)


OBJECTIVES: Registry[ObjectiveInput, ObjectiveOutput] = Registry(
    "policy objective",
    ObjectiveInput,
    ObjectiveOutput,
    inputs={
        Input.CLIP_RANGE: ("clip_range",),
        Input.GROUP_IDS: ("group_ids",),
        Input.TRIGGER_POS: ("trigger_pos",),
        Input.DYNAMICS: ("dynamics",),
    },
    gated=(Input.CLIP_RANGE, Input.GROUP_IDS, Input.TRIGGER_POS, Input.DYNAMICS),
)


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages ``[B]`` or ``[B, T]`` as a detached float ``[B, T]`` shaped like ``like``."""
    a = advantages.detach().float()
    return a.unsqueeze(1).expand_as(like) if a.dim() == 1 else a


def clipped_surrogate(
    inp: ObjectiveInput, lo: float | Tensor, hi: float | Tensor, dual_clip: float | None = None
) -> ObjectiveOutput:
    """PPO's clipped surrogate with ratio bounds ``lo`` / ``hi`` (scalars or ``[B, T]``
    tensors) and the optional dual clip ``c``:

        r = safe_ratio(log_ratio),  J = min(r A, clip(r, lo, hi) A),  (A < 0: max(J, c A))
        loss = -w J m                                                          ([B, T])

    The building block of ``ppo_clip``, ``ppo_clip_turn``, ``ctpo_clip`` (log-space bounds
    exponentiated), ``ripo`` (Fisher-Rao bounds) and ``up``'s negative branch. Metrics:
    ``clip_frac`` (clipped branch active), ``clip_frac_low`` / ``clip_frac_high`` (r out of
    the box on the side the clip acts on), ``dual_clip_frac``, ``ratio_mean``.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    r = safe_ratio(inp.ratio_log())
    unclipped = r * A
    if isinstance(lo, Tensor):
        clipped = torch.minimum(torch.maximum(r, lo), hi) * A
    else:
        clipped = r.clamp(lo, hi) * A
    J = torch.minimum(unclipped, clipped)
    clipped_active = (clipped < unclipped).float()
    if dual_clip is not None:
        dual_active = ((A < 0) & (dual_clip * A > J)).float()
        J = torch.where(A < 0, torch.maximum(J, dual_clip * A), J)
    else:
        dual_active = torch.zeros_like(m)
    loss = -w * J * m
    rd = r.detach()
    return ObjectiveOutput(
        loss,
        {
            "clip_frac": masked_mean(clipped_active, m).item(),
            "clip_frac_low": masked_mean(((rd < lo) & (A < 0)).float(), m).item(),
            "clip_frac_high": masked_mean(((rd > hi) & (A > 0)).float(), m).item(),
            "dual_clip_frac": masked_mean(dual_active, m).item(),
            "ratio_mean": masked_mean(rd, m).item(),
        },
    )
