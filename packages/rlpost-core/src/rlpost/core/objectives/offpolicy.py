"""Policy objectives for stale / off-policy data (issue 8).

All entries register into :data:`rlpost.core.objectives.OBJECTIVES` and read only the
plain :class:`~rlpost.core.objectives.ObjectiveInput` tensors ``[B, T]`` (``logp``,
``old_logp``, ``advantages``, ``mask``, optional ``log_ratio`` and ``weights``):

* ``implicit_pessimism`` (catalog 000-01): importance-weight-free off-policy objective
  whose induced target is a linear tilt of the behaviour policy (more conservative than
  the nominal target for positive advantages, unbounded for very negative ones), with the
  stabilising modification (pessimistic envelope) that keeps the target a distribution.
* ``ess_adaptive`` (catalog 000-27): the normalised effective sample size of the batch's
  ratios caps the score-function weight and sets the off-policy regulariser strength.
* ``up`` (catalog 004-15): stop-gradient-anchored, unclipped update for positive
  advantages, PPO clip for negative ones; token or sequence level via the ratio registry.
* ``ripo`` (catalog 004-08): PPO with the Euclidean ratio box replaced by a Fisher-Rao
  ball of fixed radius around each token's behaviour probability.
* ``sao`` (catalog 004-14): strict double-sided token clip (tokens outside the ratio box
  get no gradient whatever the advantage's sign); pair it with the ``gae`` value baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.contract import Coupling
from rlpost.core.masked import masked_mean
from rlpost.core.numerics import safe_ratio
from rlpost.core.objectives.base import (
    OBJECTIVES,
    ObjectiveInput,
    ObjectiveOutput,
    clipped_surrogate,
)
from rlpost.core.objectives.clipped import PPOClipParams
from rlpost.core.registry import NoParams

# --------------------------------------------------------------------------- 000-01


@dataclass(frozen=True)
class ImplicitPessimismParams:
    beta: float = 1.0  # strength of the KL(mu || pi) anchor (temperature of the target)
    stabilize: bool = True  # False: the plain no-IS objective (unbounded when A < -beta)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta must be finite and > 0, got {self.beta}")


@OBJECTIVES.register("implicit_pessimism", ImplicitPessimismParams)
def implicit_pessimism(inp: ObjectiveInput, p: ImplicitPessimismParams) -> ObjectiveOutput:
    """Off-policy objective without importance weights and its stabilising modification
    (catalog 000-01, "implicit pessimism").

    Samples y ~ mu (the stale behaviour policy, ``old_logp``), r = pi / mu = exp(log_ratio).
    Nominal objective: E_pi[A] - beta KL(mu || pi), estimated with the importance weight,

        loss_nom = -A r + beta (r - 1 - log r)         (k3 estimate of the KL)

    whose target over a softmax is pi/mu = beta / (lambda - A) (lambda normalises).
    Dropping the importance weight replaces r by 1 + log r in the advantage term
    (``stabilize=False``)::

        loss = -A log r + beta (r - 1 - log r)          d loss / d log pi = beta (r - 1) - A

    the score function on behaviour samples plus the anchor. Its induced target is the
    linear tilt pi/mu = 1 + A/beta (A centred under mu). Since log r <= r - 1, the
    advantage term is a *lower* bound of the nominal one for A > 0: the target is more
    conservative than the nominal one on the upside (implicit pessimism). For A < 0 the
    bound flips: -A log r rewards pushing pi(y) to 0 without limit, and for A < -beta
    the induced "target" has negative mass and the loss is unbounded below.

    Stabilising modification (``stabilize=True``, default): take the pessimistic side
    of the bound for both signs,

        loss = -min(A log r, A (r - 1)) + beta (r - 1 - log r)
        d loss / d log pi = beta (r - 1) - A+ + A- r        (A+ = max(A, 0), A- = max(-A, 0))

    unchanged for A >= 0 (no importance weight), the bounded linear surrogate for A < 0.
    The induced target is pi/mu = (beta + A+) / (beta + A- - kappa), kappa the scalar that
    normalises it: a proper distribution with positive mass everywhere, and more
    conservative than the nominal target on the toy softmax of the tests. The abstract
    gives no formula: the k3 anchor and the pessimistic envelope are our reading. At the
    behaviour policy (r = 1) both forms give the score function -A grad log pi; with
    A = 0 the gradient is beta (r - 1) (restoring). Shapes ``[B, T]``; all terms use
    ``log_ratio`` (default the token ratio); ``w`` multiplies the whole loss.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    lr = inp.ratio_log()
    r = safe_ratio(lr)
    surrogate = A * lr
    if p.stabilize:
        surrogate = torch.where(A > 0, surrogate, A * (r - 1.0))
    loss = w * (p.beta * (r - 1.0 - lr) - surrogate) * m
    return ObjectiveOutput(
        loss,
        {
            "below_minus_beta_frac": masked_mean((p.beta + A < 0).float(), m).item(),
            "ratio_mean": masked_mean(r.detach(), m).item(),
        },
    )


# --------------------------------------------------------------------------- 000-27


def _masked_logsumexp(x: Tensor, mask: Tensor) -> Tensor:
    """log sum_{valid} exp(x) over all elements (-inf when nothing is valid), float64."""
    return torch.where(mask > 0, x.double(), -torch.inf).logsumexp(dim=tuple(range(x.dim())))


def normalized_ess_log(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """Normalised ESS from log-ratios, in log space (no overflow whatever the log-ratios):

        ess = exp(2 logsumexp(lr) - log N - logsumexp(2 lr))  over the N valid tokens

    in (0, 1]; 1 when nothing is valid. ``log_ratio``, ``mask`` ``[B, T]``; float64 scalar.
    """
    lr = log_ratio.detach()
    n = mask.double().sum()
    lse1, lse2 = _masked_logsumexp(lr, mask), _masked_logsumexp(2.0 * lr, mask)
    ess = (2.0 * lse1 - n.clamp_min(1.0).log() - lse2).exp()
    ok = (n > 0) & torch.isfinite(ess)
    return torch.where(ok, ess.clamp(0.0, 1.0), torch.ones_like(ess))


def normalized_ess(ratio: Tensor, mask: Tensor) -> Tensor:
    """Normalised effective sample size of ratios over valid tokens, in (0, 1]:
    ESS = (sum r)^2 / (N sum r^2); 1 when nothing is valid. ``ratio``, ``mask`` ``[B, T]``.
    Computed in log space (:func:`normalized_ess_log` of ``log ratio``)."""
    return normalized_ess_log(ratio.detach().double().log(), mask)


@OBJECTIVES.register("ess_adaptive", NoParams, coupling=Coupling.BATCH)
def ess_adaptive(inp: ObjectiveInput, p: NoParams) -> ObjectiveOutput:
    """ESS-adaptive off-policy objective (catalog 000-27); no hyper-parameters.

    With r_t = exp(log_ratio) over the N valid tokens of the batch (detached)::

        rho_t = r_t / mean(r)                          self-normalised weights
        ess   = (sum r)^2 / (N sum r^2) = 1 / mean(rho^2)     in (0, 1]
        C     = 1 / (1 - ess)                          cap (inf when the ratios are uniform)
        lam   = 1 - ess                                off-policy regulariser strength
        loss_t = w * (-sg(min(rho_t, C)) A_t log pi_t + lam (log r_t)^2 / 2)

    d loss / d log pi = w (-min(rho, C) A + lam log r). Uniform ratios (ess = 1): rho = 1,
    no cap, lam = 0, so the gradient is exactly the on-policy score function -A grad
    log pi. As ratios concentrate, ess falls, the cap C = 1 + 1/CV^2 (CV: coefficient of
    variation of r) tightens towards 1 and the pull lam log r back to the behaviour
    policy grows; high-ratio tokens keep weight C >= 1 (a nonzero signal, unlike PPO's
    clip). The abstract fixes the statistic and its three roles, not the maps: C, lam
    and the k2-form regulariser are our reading. The statistic is over the tokens
    passed in: pass the whole step's batch (as the ESS is a batch statistic,
    micro-batches give each their own ESS). Shapes ``[B, T]``. Numerics: ess and rho are
    computed in log space (rho_t = exp(log r_t - logmeanexp(log r))), so one huge ratio
    gives ess ~ 1/N and a finite loss instead of NaN everywhere.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    lr = inp.ratio_log()
    lrd = lr.detach().double()
    ess = normalized_ess_log(lrd, m)
    n = m.double().sum().clamp_min(1.0)
    log_mean_r = _masked_logsumexp(lrd, m) - n.log()
    rho = torch.where(m > 0, (lrd - log_mean_r).clamp(max=700.0).exp(), 0.0)  # float64
    cap = 1.0 / (1.0 - ess).clamp_min(1e-12)
    omega = torch.minimum(rho, cap).to(lr.dtype)
    lam = (1.0 - ess).to(lr.dtype)
    loss = w * (-omega * A * inp.logp_valid() + 0.5 * lam * lr * lr) * m
    return ObjectiveOutput(
        loss,
        {
            "ess": ess.item(),
            "ess_cap": min(cap.item(), 1e12),
            "ess_reg": lam.item(),
            "clip_frac": masked_mean((rho > cap).float(), m).item(),
            "ratio_mean": masked_mean(safe_ratio(lr.detach()), m).item(),
        },
    )


# --------------------------------------------------------------------------- 004-15


@dataclass(frozen=True)
class UPParams:
    clip_low: float = 0.2  # clip of negative-advantage tokens: r >= 1 - clip_low
    clip_high: float = 0.28  # and r <= 1 + clip_high (PPO's min keeps the pessimistic side)

    def __post_init__(self) -> None:
        PPOClipParams(self.clip_low, self.clip_high)  # same validation


@OBJECTIVES.register("up", UPParams)
def up(inp: ObjectiveInput, p: UPParams) -> ObjectiveOutput:
    """UP: unbounded positive asymmetric optimisation (catalog 004-15).

    With x = log_ratio (token ratio, or GSPO's sequence ratio from ``RATIOS["sequence"]``)::

        A > 0:  J = A exp(x - sg(x))          value A, gradient A grad x (anchored at
                                              the current policy: never clipped)
        A <= 0: J = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),   r = exp(x)
        loss = -w J

    d loss / d log pi: -w A (token level) or -w A / |y| (sequence level) for A > 0,
    whatever the ratio; PPO's -w r A inside the box and 0 outside for A < 0. Anchoring
    with the stop-gradient is the abstract's "anchoring the policy to its current state";
    dropping the IS weight on the positive branch (the anchor's value is 1) is our
    reading of "unclipped, stable" (pure IS is what the abstract calls unstable).
    Shapes ``[B, T]``. The negative branch is
    :func:`~rlpost.core.objectives.clipped_surrogate` (PPO's min, ``safe_ratio``: the
    discarded branch never overflows).
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    x = inp.ratio_log()
    lo, hi = 1.0 - p.clip_low, 1.0 + p.clip_high
    neg_loss = clipped_surrogate(inp, lo, hi).loss  # -w min(r A, clip(r) A) m
    pos_loss = -w * A * torch.exp(x - x.detach()) * m  # value -w A, gradient -w A grad x
    rd = safe_ratio(x.detach())
    return ObjectiveOutput(
        torch.where(A > 0, pos_loss, neg_loss),
        {
            "pos_beyond_clip_frac": masked_mean(((A > 0) & (rd > hi)).float(), m).item(),
            "clip_frac_low": masked_mean(((A < 0) & (rd < lo)).float(), m).item(),
            "ratio_mean": masked_mean(rd, m).item(),
        },
    )


# --------------------------------------------------------------------------- 004-08


@dataclass(frozen=True)
class RIPOParams:
    delta: float = 0.1  # Fisher-Rao half-width in phi = arcsin(sqrt(p)); 0.1 ~ PPO 0.2 at p=1/2

    def __post_init__(self) -> None:
        if not (0 < self.delta < math.pi / 2):
            raise ValueError(f"delta must be in (0, pi/2), got {self.delta}")


def fisher_rao_ratio_bounds(old_logp: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """Ratio bounds ``[B, T]`` of RIPO's Fisher-Rao ball of radius 2 delta around each
    token's behaviour probability p: ratios r with |arcsin sqrt(r p) - arcsin sqrt(p)| <= delta
    (clamped to p' in [0, 1]); computed in float64, returned in ``old_logp``'s dtype."""
    pd = old_logp.detach().double().exp().clamp(1e-12, 1.0)
    phi = pd.sqrt().asin()
    p_hi = (phi + delta).clamp(max=math.pi / 2).sin().square()
    p_lo = (phi - delta).clamp(min=0.0).sin().square()
    return (p_lo / pd).to(old_logp.dtype), (p_hi / pd).to(old_logp.dtype)


@OBJECTIVES.register("ripo", RIPOParams)
def ripo(inp: ObjectiveInput, p: RIPOParams) -> ObjectiveOutput:
    """RIPO: Riemannian-isometric policy optimisation (catalog 004-08).

    PPO bounds |r - 1| <= eps, i.e. |p' - p| <= eps p: a Euclidean box whose Fisher-Rao
    length eps sqrt(p) shrinks for rare tokens and grows for likely ones. RIPO bounds the
    Fisher-Rao distance instead. For the sampled token's probability p = pi_old(y_t) (the
    rest of the vocabulary rescaled), the Fisher-Rao distance between the two-point
    distributions (p, 1-p) and (p', 1-p') is 2 |arcsin sqrt(p') - arcsin sqrt(p)|, so with
    phi = arcsin sqrt(p)::

        lo_t = sin^2(max(phi - delta, 0)) / p,   hi_t = sin^2(min(phi + delta, pi/2)) / p
        J    = min(r A, clip(r, lo_t, hi_t) A),  loss = -w J

    Every token may move exactly Fisher-Rao distance 2 delta up or down (until p' hits 0
    or 1), so the allowed update is the same ball for low- and high-probability tokens.
    d loss / d log pi = -w r A inside the unclipped branch, else 0. The abstract names
    the geometry but no formula: the two-point (sampled token vs rest) projection and
    the per-token ball are our reading. Meant for the token ratio (p is per token).
    Shapes ``[B, T]``; metric ``ratio_width_mean`` = mean (hi - lo) over valid tokens.
    """
    lo, hi = fisher_rao_ratio_bounds(inp.old_logp, p.delta)
    out = clipped_surrogate(inp, lo, hi)
    out.metrics["ratio_width_mean"] = masked_mean((hi - lo).float(), inp.mask_f).item()
    return out


# --------------------------------------------------------------------------- 004-14


@dataclass(frozen=True)
class SAOParams:
    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        PPOClipParams(self.clip_low, self.clip_high)  # same validation


@OBJECTIVES.register("sao", SAOParams)
def sao(inp: ObjectiveInput, p: SAOParams) -> ObjectiveOutput:
    """SAO's strict double-sided token-level clip (catalog 004-14).

        inside_t = 1 - eps_low <= r_t <= 1 + eps_high
        J = r A on inside tokens, sg(r) A outside,    loss = -w J

    d loss / d log pi = -w r A inside, 0 outside, for *either* sign of A: PPO's min only
    clips the side that helps the surrogate (A > 0 with r < 1 - eps, or A < 0 with
    r > 1 + eps, keep their gradient there). The loss value is the unclipped surrogate.
    SAO trains one rollout per prompt with a value model: use the ``gae`` advantage
    (preset ``sao``). Shapes ``[B, T]``.
    """
    m, A, w = inp.mask_f, inp.adv_tokens(), inp.weights_or_ones()
    r = safe_ratio(inp.ratio_log())
    lo, hi = 1.0 - p.clip_low, 1.0 + p.clip_high
    rd = r.detach()
    inside = (rd >= lo) & (rd <= hi)
    J = torch.where(inside, r, rd) * A
    return ObjectiveOutput(
        -w * J * m,
        {
            "clip_frac": masked_mean((~inside).float(), m).item(),
            "clip_frac_low": masked_mean((rd < lo).float(), m).item(),
            "clip_frac_high": masked_mean((rd > hi).float(), m).item(),
            "ratio_mean": masked_mean(rd, m).item(),
        },
    )
