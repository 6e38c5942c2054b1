"""Group-level policy objectives: Mu-GRPO (000-17), ConSPO (000-25), LPO (001-17).

All three register into :data:`rlpost.core.objectives.OBJECTIVES` and share its signature
``fn(ObjectiveInput, params) -> ObjectiveOutput`` (per-token loss ``[B, T]``).

* ``mu_grpo`` is token-level (PPO clip with relaxed bounds) plus a *veto* that removes the
  updates of the suffix after a trigger token in negative-advantage responses; it reads
  the optional ``ObjectiveInput.trigger_pos`` ``[B]``.
* ``conspo`` and ``lpo`` couple the responses sampled for one prompt and need
  ``ObjectiveInput.group_ids`` ``[B]``; their loss is a function of per-response
  *sequence* scores, written on every valid token of a response so that the
  ``seq_mean_token_mean`` aggregation gives the per-sequence objective exactly (as the
  GSPO sequence ratio does). They are registered with ``coupling=Coupling.GROUP``: a
  micro-batch must hold whole groups (``Recipe.policy_loss`` checks this against
  ``Preset.group_size``, and trainers split batches on group boundaries).

Group reductions are vectorised with ``index_add_`` / ``scatter_reduce_`` over a dense
group index (per-element group sums: :func:`rlpost.core.masked.group_sum`); there is no
Python loop over the batch or the groups.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlpost.core.advantages.base import TrainingDynamics
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_sum, masked_mean, masked_sum
from rlpost.core.objectives.base import OBJECTIVES, ObjectiveInput, ObjectiveOutput
from rlpost.core.objectives.clipped import PPOClipParams, ppo_clip

# ---------------------------------------------------------------------------------------
# shared helpers


def _row_advantage(inp: ObjectiveInput) -> Tensor:
    """Response-level advantage ``[B]``: ``A`` itself, or the masked row mean of ``[B, T]``."""
    a = inp.advantages.detach().float()
    return a if a.dim() == 1 else masked_mean(a, inp.mask_f, dim=1)


def _group_index(inp: ObjectiveInput, who: str) -> tuple[Tensor, int]:
    if inp.group_ids is None:
        raise ValueError(
            f"{who} needs ObjectiveInput.group_ids ([B] prompt labels; "
            "Recipe.policy_loss(group_ids=...))"
        )
    _, idx = torch.unique(inp.group_ids, return_inverse=True)
    return idx, (int(idx.max()) + 1 if idx.numel() else 0)


def _group_sum(x: Tensor, idx: Tensor, n: int) -> Tensor:
    """``[B]`` -> ``[G]`` sums (per group, not gathered back: ``masked.group_sum`` is the
    per-element ``[B]`` form)."""
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, idx, x)


def _group_max(x: Tensor, idx: Tensor, n: int, valid: Tensor) -> Tensor:
    """``[B]`` -> ``[G]`` max over the ``valid`` members (detached; 0 for none)."""
    x = torch.where(valid, x.detach(), torch.full_like(x, -torch.inf))
    g = torch.full((n,), -torch.inf, dtype=x.dtype, device=x.device)
    g = g.scatter_reduce(0, idx, x, reduce="amax")
    return torch.where(torch.isfinite(g), g, torch.zeros_like(g))


def _group_log_softmax(x: Tensor, idx: Tensor, n: int) -> Tensor:
    """log softmax of ``x`` ``[B]`` within each group (shift by the detached group max)."""
    c = _group_max(x, idx, n, torch.ones_like(x, dtype=torch.bool))[idx]
    lse = _group_sum((x - c).exp(), idx, n).log()[idx] + c
    return x - lse


# ---------------------------------------------------------------------------------------
# Mu-GRPO (000-17)


def first_trigger(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """Index ``[B]`` (long) of each response's first valid token whose ratio ``exp(log_ratio)``
    leaves ``[low, high]``; -1 where none does. ``log_ratio``, ``mask``: ``[B, T]``."""
    r = log_ratio.detach().exp()
    out = ((r < low) | (r > high)) & (mask > 0)
    first = out.int().argmax(dim=1)
    return torch.where(out.any(dim=1), first, torch.full_like(first, -1))


def veto_keep_mask(trigger_pos: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Mu-GRPO negative-advantage veto as a keep-mask ``[B, T]`` (1 keep, 0 vetoed).

    keep_it = 0  iff  A_i < 0  and  trigger_i >= 0  and  t > trigger_i   (and m_it = 1)

    ``trigger_pos`` ``[B]`` int (-1: no trigger), ``advantages`` ``[B]`` (response level),
    ``mask`` ``[B, T]``. The trigger token itself and its prefix keep their update; so do
    all tokens of non-negative-advantage responses. Masked tokens are 0.
    """
    if trigger_pos.shape != mask.shape[:1] or advantages.shape != mask.shape[:1]:
        raise ValueError(
            f"veto_keep_mask: trigger_pos {tuple(trigger_pos.shape)} and advantages "
            f"{tuple(advantages.shape)} must be [B] for mask {tuple(mask.shape)}"
        )
    t = torch.arange(mask.shape[1], device=mask.device)
    pos = trigger_pos.to(mask.device).long()
    veto = (advantages < 0)[:, None] & (pos >= 0)[:, None] & (t[None, :] > pos[:, None])
    return (~veto).to(mask.dtype if mask.is_floating_point() else torch.float32) * (mask > 0)


@dataclass(frozen=True)
class MuGRPOParams:
    clip_low: float = 0.5  # relaxed: r in [0.5, 2] (symmetric in log space), PPO uses 0.2
    clip_high: float = 1.0
    dual_clip: float | None = None
    veto: bool = True

    def __post_init__(self) -> None:
        PPOClipParams(self.clip_low, self.clip_high, self.dual_clip)  # same validation


@OBJECTIVES.register("mu_grpo", MuGRPOParams, reads={Input.TRIGGER_POS})
def mu_grpo(inp: ObjectiveInput, p: MuGRPOParams) -> ObjectiveOutput:
    """Mu-GRPO (catalog 000-17): relaxed clipping + negative-advantage veto for stale rollouts.

        J_it   = min(r_it A_i, clip(r_it, 1 - eps_lo, 1 + eps_hi) A_i)   (relaxed eps)
        keep_it = 0 if A_i < 0 and t > tau_i else 1                     (the veto)
        loss_it = -w_it keep_it J_it m_it

    ``tau_i`` is ``ObjectiveInput.trigger_pos`` ``[B]`` (-1: no trigger) when given; else
    (our reading) the first valid token whose ratio leaves the relaxed range
    ``[1 - eps_lo, 1 + eps_hi]``: from there on the stale rollout follows a prefix the
    current policy has moved away from, and pushing its suffix down in a
    negative-advantage response is the destabilising update the abstract names. The
    trigger token keeps its (clipped) update. Shapes ``[B, T]``; ``A`` ``[B]`` or
    ``[B, T]`` (a response is negative when its masked mean advantage is < 0).
    The abstract's "few (e.g. four) large sequential generation-optimisation stages" are a
    trainer schedule, not part of this loss (see docs/algorithms/mu_grpo.md).
    Gradient: ``ppo_clip``'s on kept tokens, exactly 0 on vetoed ones.
    """
    m = inp.mask_f
    clip = PPOClipParams(p.clip_low, p.clip_high, p.dual_clip)
    if not p.veto:
        return ppo_clip(inp, clip)
    A = _row_advantage(inp)
    if inp.trigger_pos is not None:
        pos = inp.trigger_pos.long()
    else:
        pos = first_trigger(inp.ratio_log(), m, 1.0 - p.clip_low, 1.0 + p.clip_high)
    keep = veto_keep_mask(pos, A, m)
    out = ppo_clip(dataclasses.replace(inp, mask=keep), clip)
    n_valid = m.sum().clamp_min(1.0)
    return ObjectiveOutput(
        out.loss,
        {
            **out.metrics,
            "veto_frac": ((m - keep).sum() / n_valid).item(),
            "trigger_frac": ((pos >= 0) & (A < 0)).float().mean().item(),
        },
    )


# ---------------------------------------------------------------------------------------
# ConSPO (000-25)


def conspo_margin(progress: float, start: float = 0.0, end: float = 0.1) -> float:
    """Curriculum margin of ConSPO: linear from ``start`` (progress 0) to ``end`` (1).

    The ``conspo`` entry applies it itself when ``margin_end`` is set (from the trainer's
    training progress).
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be in [0, 1], got {progress}")
    return start + (end - start) * progress


@dataclass(frozen=True)
class ConSPOParams:
    tau: float = 0.1  # InfoNCE temperature, in nats per token of the length-normalised score
    margin: float = 0.0  # delta subtracted from each positive's score (at progress 0)
    # curriculum: the margin ramps linearly from `margin` (progress 0) to `margin_end`
    # (progress 1) with the training progress the trainer passes; None: a fixed margin
    margin_end: float | None = None

    def __post_init__(self) -> None:
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise ValueError(f"tau must be finite and > 0, got {self.tau}")
        for name in ("margin", "margin_end"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")

    def margin_at(self, dynamics: TrainingDynamics | None) -> float:
        if self.margin_end is None:
            return self.margin
        return conspo_margin(dynamics.progress, self.margin, self.margin_end)


def _conspo_needs(p: ConSPOParams) -> set[Input]:
    """group ids always; the training progress too when the margin is scheduled."""
    return {Input.GROUP_IDS} | ({Input.DYNAMICS} if p.margin_end is not None else set())


@OBJECTIVES.register("conspo", ConSPOParams, needs=_conspo_needs, coupling=Coupling.GROUP)
def conspo(inp: ObjectiveInput, p: ConSPOParams) -> ObjectiveOutput:
    """ConSPO (catalog 000-25): contrastive sequence-level policy optimisation.

    Score of response i (length-normalised sequence log-likelihood, not a ratio):

        s_i = (1/|y_i|) sum_t m_it log pi(y_it)

    Positives P_g = {A_i > 0}, negatives N_g = {A_i < 0} within group g (``group_ids``).
    Group-wise InfoNCE of each positive against the group's negative distractors, with
    margin delta:

        z_i = (s_i - delta)/tau,   D_i = e^{z_i} + sum_{j in N_g} e^{s_j/tau}
        L_i = tau (log D_i - z_i)                      for i in P_g, N_g non-empty
        loss_it = w_it L_i m_it                        (0 for other rows)

    With ``seq_mean_token_mean`` this sums L_i over positives / N_seq. Gradient:
    dL/ds_i = -(1 - e^{z_i}/D_i) for the positive (larger for poorly separated positives),
    dL/ds_j = e^{s_j/tau}/D_i for each negative (larger for high-scoring negatives).
    Groups without a positive or a negative contribute nothing. The curriculum: with
    ``margin_end`` set, delta ramps linearly from ``margin`` to ``margin_end`` over the
    training progress (``ObjectiveInput.dynamics.progress``, :func:`conspo_margin`; the
    preset's 0 -> 0.1 is ours).
    Shapes: logp / mask ``[B, T]``, A ``[B]`` or ``[B, T]``, group_ids ``[B]``. The
    tau scale, summing over positives and the linear curriculum are our reading.
    """
    idx, n = _group_index(inp, "conspo")
    margin = p.margin_at(inp.dynamics)
    m = inp.mask_f
    length = m.sum(1)
    s = masked_mean(inp.logp, m, dim=1)  # [B]; masked (-inf padding) tokens never read
    A = _row_advantage(inp)
    pos = (A > 0) & (length > 0)
    neg = (A < 0) & (length > 0)
    z_neg = s / p.tau
    z_pos = (s - margin) / p.tau
    # stable log D_i: shift by c_i = max(z_i, max_{j in N_g} z_j) (detached), so one of the
    # two terms below is >= 1 whatever the spread of scores
    c_neg = _group_max(z_neg, idx, n, neg)  # [G]
    # -inf before exp (not where after it): no inf * 0 = NaN in the backward of other rows
    shifted = torch.where(neg, z_neg - c_neg[idx], torch.full_like(s, -torch.inf))
    s_neg = group_sum(shifted.exp(), inp.group_ids)  # [B]: the row's group's sum
    active = pos & (group_sum(neg.float(), inp.group_ids) > 0)
    c = torch.maximum(z_pos.detach(), c_neg[idx])
    e_pos = (z_pos - c).exp()
    d = e_pos + (c_neg[idx] - c).exp() * s_neg  # D_i e^{-c_i}
    log_d = torch.log(torch.where(active, d, torch.ones_like(s)))
    L = torch.where(active, p.tau * (log_d - (z_pos - c)), torch.zeros_like(s))
    loss = inp.weights_or_ones() * L[:, None] * m
    with torch.no_grad():
        prob = torch.where(active, e_pos / log_d.exp(), torch.zeros_like(s))  # P_i
        n_act = active.sum().clamp_min(1)
        n_pos, n_neg = pos.sum().clamp_min(1), neg.sum().clamp_min(1)
    return ObjectiveOutput(
        loss,
        {
            "pos_prob": (prob.sum() / n_act).item(),
            "score_gap": (
                (s.detach() * pos).sum() / n_pos - (s.detach() * neg).sum() / n_neg
            ).item(),
            "contrast_frac": active.float().mean().item(),
            "margin": float(margin),
        },
    )


# ---------------------------------------------------------------------------------------
# LPO (001-17)

Divergence = Literal["forward_kl", "reverse_kl", "hellinger"]


def lpo_projection_grad(logq: Tensor, logp: Tensor, idx: Tensor, n: int, div: Divergence):
    """Divergence D_g(p*, q) per group ``[G]`` and its gradient ``dD/dl_i`` ``[B]`` (detached).

    q = softmax_g(l), p* the target, both given as within-group log-probs ``[B]``:
      forward_kl  D = sum p log(p/q)          dD/dl_i = q_i - p_i
      reverse_kl  D = sum q log(q/p)          dD/dl_i = q_i (log(q_i/p_i) - D)
      hellinger   D = 1 - sum sqrt(p q)       dD/dl_i = -(sqrt(p_i q_i) - q_i sum_j sqrt(p_j q_j))/2
    Each gradient sums to 0 over a group; |.| <= 1 (forward), <= 1/2 (Hellinger),
    <= 1/e + log(1/min p) (reverse).
    """
    logq, logp = logq.detach(), logp.detach()
    q, pt = logq.exp(), logp.exp()
    if div == "forward_kl":
        D = _group_sum(pt * (logp - logq), idx, n)
        g = q - pt
    elif div == "reverse_kl":
        D = _group_sum(q * (logq - logp), idx, n)
        g = q * (logq - logp - D[idx])
    elif div == "hellinger":
        sq = (0.5 * (logq + logp)).exp()
        bc = _group_sum(sq, idx, n)
        D = 1.0 - bc
        g = -0.5 * (sq - q * bc[idx])
    else:
        raise ValueError(f"unknown divergence {div!r}; valid: forward_kl, reverse_kl, hellinger")
    return D, g


@dataclass(frozen=True)
class LPOParams:
    beta: float = 1.0  # proximal strength: p* = softmax_g(A / beta)
    divergence: Divergence = "forward_kl"
    length_norm: bool = True  # l_i = mean (True) or sum (False) of the token log-ratios

    def __post_init__(self) -> None:
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"beta must be finite and > 0, got {self.beta}")
        if self.divergence not in ("forward_kl", "reverse_kl", "hellinger"):
            raise ValueError(
                f"divergence must be forward_kl, reverse_kl or hellinger, got {self.divergence!r}"
            )


@OBJECTIVES.register("lpo", LPOParams, needs={Input.GROUP_IDS}, coupling=Coupling.GROUP)
def lpo(inp: ObjectiveInput, p: LPOParams) -> ObjectiveOutput:
    """LPO (catalog 001-17): listwise policy optimisation on the response simplex.

    The policy restricted to a group's n_g sampled responses, relative to the sampler:

        l_i = (1/|y_i|) sum_t m_it log r_it   (``length_norm``; else the sum)
        q_i = softmax_g(l)_i                  (= 1/n_g at the old policy)

    Explicit target: the proximal objective restricted to the simplex,
    ``max_q sum_i q_i A_i - beta KL(q || uniform)``, solved exactly:

        p*_i = softmax_g(A / beta)_i          (detached)

    Exact projection: minimise D(p*, q) (``divergence``: forward_kl, reverse_kl or
    hellinger). Per token: loss_it = w_it beta (D_g + n_g sg(dD_g/dl_i) (l_i - sg(l_i))) m_it,
    whose value is beta D_g on each row (``seq_mean_token_mean`` gives
    sum_g n_g beta D_g / N_seq) and whose gradient is the exact projection gradient

        dLoss/dl_i = n_g beta dD_g/dl_i    (forward KL: n_g beta (q_i - p*_i))

    zero-sum over the group, bounded, and zero once q = p* (self-correcting). The n_g beta
    scale makes the on-policy forward-KL gradient equal to GRPO's to first order in A/beta
    (``-(A_i - mean_g A) / |y_i|`` per token). Shapes: ``[B, T]``, A ``[B]`` or ``[B, T]``,
    group_ids ``[B]``. The uniform prior, the sequence log-ratio and the scale are our
    reading of "target on the response simplex". A response with no valid token (all
    masked, e.g. rejected by a correction) is not a member of its group's simplex: it is
    moved to a singleton group of its own (q = p* = 1, D = 0, zero gradient), so its
    advantage cannot reshape the other responses' target; n_g counts valid responses.
    """
    idx, n = _group_index(inp, "lpo")
    m = inp.mask_f
    valid = m.sum(1) > 0  # [B]
    n_real = n
    # rows without a valid token get singleton groups n, n + 1, ... (no loop)
    extra = (~valid).long().cumsum(0) - 1 + n
    idx = torch.where(valid, idx, extra)
    n = n + int((~valid).sum())
    lr = masked_sum(inp.ratio_log(), m, dim=1)
    ell = masked_mean(inp.ratio_log(), m, dim=1) if p.length_norm else lr  # [B]
    logq = _group_log_softmax(ell.detach(), idx, n)
    logt = _group_log_softmax(_row_advantage(inp) / p.beta, idx, n)
    D, g = lpo_projection_grad(logq, logt, idx, n, p.divergence)
    size = _group_sum(torch.ones_like(ell), idx, n)[idx]
    row = p.beta * (D[idx] + size * g * (ell - ell.detach()))
    loss = inp.weights_or_ones() * row[:, None] * m
    with torch.no_grad():
        tv = 0.5 * _group_sum((logq.exp() - logt.exp()).abs(), idx, n)[:n_real]
    return ObjectiveOutput(
        loss,
        {
            "lpo_divergence": D[:n_real].mean().item() if n_real else 0.0,
            "lpo_tv_to_target": tv.mean().item() if n_real else 0.0,
            "lpo_grad_abs_max": g.abs().max().item() if g.numel() else 0.0,
        },
    )


# ---------------------------------------------------------------------------------------
# presets
