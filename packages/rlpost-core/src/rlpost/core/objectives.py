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
  :mod:`rlpost.core.group_objectives` (``conspo``, ``lpo``).
* ``trigger_pos`` ``[B]``: optional integer trigger token index per response (-1: none);
  read by ``mu_grpo``'s negative-advantage veto.

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

from rlpost.core.masked import masked_mean
from rlpost.core.registry import NoParams, Registry


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
    "policy objective", ObjectiveInput, ObjectiveOutput
)

# objectives that read ObjectiveInput.group_ids and couple the responses of a group
# (registered in rlpost.core.group_objectives): only they need whole groups per micro-batch
GROUP_OBJECTIVES: frozenset[str] = frozenset({"conspo", "lpo"})
# objectives whose loss reads a statistic of all the tokens they are given (the batch's
# normalised ESS): exact only when the whole step batch is one micro-batch on one process
BATCH_OBJECTIVES: frozenset[str] = frozenset({"ess_adaptive"})

# log-ratio bound before exp: e^40 ~ 2.4e17, so a ratio times an advantage, summed over
# a batch of tokens, stays far below float32's max (~3.4e38 = e^88.7)
LOG_RATIO_MAX = 40.0


def safe_ratio(log_ratio: Tensor) -> Tensor:
    """``exp(min(log_ratio, LOG_RATIO_MAX))``: the policy ratio without overflow.

    Identical to ``exp`` below the bound; above it the value saturates and the gradient is
    0 (the clamp's), so a branch that ``torch.where`` / ``minimum`` discards can never
    contribute ``0 * inf = NaN`` to the backward pass.
    """
    return log_ratio.clamp(max=LOG_RATIO_MAX).exp()


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages ``[B]`` or ``[B, T]`` as a detached float ``[B, T]`` shaped like ``like``."""
    a = advantages.detach().float()
    return a.unsqueeze(1).expand_as(like) if a.dim() == 1 else a


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


@OBJECTIVES.register("ppo_clip_turn", PPOClipParams)
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
