"""Predictive divergence mask: a DPPO-style trust region with a predicted direction (catalog 004-05).

A DPPO-style trust region masks a token when two criteria hold:

* proximity: the divergence D(mu_t, pi_t) between the behaviour distribution mu_t and the
  training distribution pi_t at position t exceeds delta;
* direction: the next policy-gradient step would move D further up.

PPO's direction test is a single-sample proxy (the sampled-token ratio moving away from
1). Here the direction is *predicted* from the distributions: for a softmax policy with
logits z (the tabular reading, logits as parameters) the policy-gradient step of token y
with advantage A is dz = eta A (e_y - pi), so to first order

    dD = eta A s,   s = grad_z D . (e_y - pi) = g_y - sum_v pi_v g_v,   g = grad_z D

    KL(mu || pi):  g_v = pi_v sum_u mu_u - mu_v       (= pi_v - mu_v)
    TV(mu, pi):    g_v = 1/2 pi_v (sgn_v - sum_u sgn_u pi_u),   sgn = sign(pi - mu)

and the token is masked iff D > delta and A s > 0.

Rollout engines expose only the top-K of mu. The two top-K estimators apply the same
closed form on a reduced categorical over S = top-K ids plus the sampled token y (whose
log-probs under both policies are always known):

* ``lumped``: S plus one bucket holding the rest of each distribution's mass, treated as
  one more softmax category (a coarsening: D is a lower bound, data-processing inequality);
* ``renorm``: both distributions restricted to S and renormalised.

Both are exact when S is the whole vocabulary; ``tests/test_divergence_mask.py`` measures
how fast they converge as K grows.

Functional API: :func:`divergence_and_direction` (any categorical, ``[..., N]``),
:func:`predictive_divergence` (full logits ``[B, T, V]``), :func:`topk_predictive_divergence`
(top-K log-probs ``[B, T, K]``). Registry entry: ``CORRECTIONS["predictive_divergence_mask"]`` (fed by ``RatioInput.dists``
and ``RatioInput.advantages``); pair it with ``OBJECTIVES["is_pg"]``.
Left out: the second-order term of dD and the non-tabular (shared-parameter) geometry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.masked import masked_mean
from rlpost.core.objectives.base import broadcast_advantages
from rlpost.core.ratios.base import CORRECTIONS, CorrectionOutput, RatioInput, TokenDistributions

Divergence = Literal["tv", "kl"]
_LOG_FLOOR = -80.0  # log-prob floor inside KL (a category mu has but pi lacks)
# rows of [B, T, K] processed at once by predictive_divergence_mask: bounds its float64
# temporaries to ~CHUNK_ELEMENTS * (K + 2) / K elements each (~32 MiB), whatever B
CHUNK_ELEMENTS = 1 << 22


class DivergencePrediction(NamedTuple):
    divergence: Tensor  # D(mu, pi), shape [...]
    direction: Tensor  # s = grad_z D . (e_y - pi): dD / d(eta A) of the next PG step, [...]


def divergence_and_direction(
    logp: Tensor, old_logp: Tensor, sampled_index: Tensor, kind: Divergence = "tv"
) -> DivergencePrediction:
    """Closed-form D(mu, pi) and its first-order change under the PG step of the sampled token.

    ``logp`` / ``old_logp`` ``[..., N]``: log pi and log mu over N categories (-inf allowed,
    each should sum to 1); ``sampled_index`` ``[...]`` in [0, N). Returns ``D`` and ``s`` with
    D(softmax(z + h (e_y - pi))) = D + h s + O(h^2). Computed detached, in float64.
    """
    lp, lq = logp.detach().double(), old_logp.detach().double()
    pi, mu = lp.exp(), lq.exp()
    onehot = torch.zeros_like(pi).scatter_(-1, sampled_index.long().unsqueeze(-1), 1.0)
    if kind == "kl":  # KL(mu || pi)
        div = torch.where(mu > 0, mu * (lq - lp.clamp_min(_LOG_FLOOR)), 0.0).sum(-1)
        g = pi * mu.sum(-1, keepdim=True) - mu
    elif kind == "tv":
        sgn = torch.sign(pi - mu)
        div = 0.5 * (pi - mu).abs().sum(-1)
        g = 0.5 * pi * (sgn - (sgn * pi).sum(-1, keepdim=True))
    else:
        raise ValueError(f"unknown divergence {kind!r}; valid: 'tv', 'kl'")
    s = (g * onehot).sum(-1) - (pi * g).sum(-1)
    dt = logp.dtype if logp.dtype.is_floating_point else torch.float32
    return DivergencePrediction(div.to(dt), s.to(dt))


def predictive_divergence(
    logits: Tensor, old_logits: Tensor, tokens: Tensor, kind: Divergence = "tv"
) -> DivergencePrediction:
    """Exact D and direction from full logits: ``logits`` / ``old_logits`` ``[B, T, V]``
    (training / behaviour policy), ``tokens`` ``[B, T]``. Holds ``[B, T, V]`` float64
    temporaries: call it on row chunks for large vocabularies."""
    d = TokenDistributions.from_logits(logits, old_logits, tokens)
    return divergence_and_direction(d.logp, d.old_logp, d.sampled_index, kind)


def _reduced(
    topk_logp: Tensor,
    topk_old_logp: Tensor,
    sampled_index: Tensor,
    sampled_logp: Tensor,
    sampled_old_logp: Tensor,
    estimator: Literal["lumped", "renorm"],
) -> tuple[Tensor, Tensor, Tensor]:
    """Categoricals over S = top-K + {y} (+ rest bucket): ``[B, T, K + 1 (+ 1)]``, index of y."""
    outside = sampled_index < 0  # [B, T]
    ninf = torch.full_like(sampled_logp, float("-inf"))
    extra_p = torch.where(outside, sampled_logp, ninf).unsqueeze(-1)
    extra_q = torch.where(outside, sampled_old_logp, ninf).unsqueeze(-1)
    lp = torch.cat([topk_logp.double(), extra_p.double()], -1)  # [B, T, K + 1]
    lq = torch.cat([topk_old_logp.double(), extra_q.double()], -1)
    idx = torch.where(outside, torch.full_like(sampled_index, lp.shape[-1] - 1), sampled_index)
    if estimator == "lumped":
        rest_p = (1.0 - lp.exp().sum(-1, keepdim=True)).clamp_min(0.0).log()
        rest_q = (1.0 - lq.exp().sum(-1, keepdim=True)).clamp_min(0.0).log()
        lp, lq = torch.cat([lp, rest_p], -1), torch.cat([lq, rest_q], -1)  # [B, T, K + 2]
    elif estimator != "renorm":
        raise ValueError(f"unknown top-K estimator {estimator!r}; valid: 'lumped', 'renorm'")
    return lp.log_softmax(-1), lq.log_softmax(-1), idx


def topk_predictive_divergence(
    topk_logp: Tensor,
    topk_old_logp: Tensor,
    sampled_index: Tensor,
    sampled_logp: Tensor,
    sampled_old_logp: Tensor,
    kind: Divergence = "tv",
    estimator: Literal["lumped", "renorm"] = "lumped",
) -> DivergencePrediction:
    """Top-K estimate of D and the direction (module docstring).

    ``topk_logp`` / ``topk_old_logp`` ``[B, T, K]``: log pi / log mu of the engine's top-K ids;
    ``sampled_index`` ``[B, T]``: column of the sampled token among them, -1 if absent;
    ``sampled_logp`` / ``sampled_old_logp`` ``[B, T]``: log pi / log mu of the sampled token
    (used when it is outside the top-K). ``lumped`` keeps the rest mass as one category,
    ``renorm`` renormalises on the ids; both exact when K = V.
    """
    lp, lq, idx = _reduced(
        topk_logp, topk_old_logp, sampled_index, sampled_logp, sampled_old_logp, estimator
    )
    out = divergence_and_direction(lp, lq, idx, kind)
    dt = topk_logp.dtype
    return DivergencePrediction(out.divergence.to(dt), out.direction.to(dt))


@dataclass(frozen=True)
class PredictiveMaskParams:
    divergence: Divergence = "tv"
    threshold: float = 0.15  # delta of the proximity criterion D > delta
    estimator: Literal["lumped", "renorm"] = "lumped"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be finite and >= 0, got {self.threshold}")
        if self.divergence not in ("tv", "kl"):
            raise ValueError(f"divergence must be 'tv' or 'kl', got {self.divergence!r}")
        if self.estimator not in ("lumped", "renorm"):
            raise ValueError(f"estimator must be 'lumped' or 'renorm', got {self.estimator!r}")


@CORRECTIONS.register(
    "predictive_divergence_mask",
    PredictiveMaskParams,
    needs={Input.TOKEN_DISTS, Input.ADVANTAGES},
    reads={Input.ROLLOUT_LOGPROBS},
)
def predictive_divergence_mask(inp: RatioInput, p: PredictiveMaskParams) -> CorrectionOutput:
    """Predictive divergence mask (catalog 004-05): DPPO-style divergence trust region whose
    direction criterion predicts the sign of the divergence change of the next PG step.

        D_t = D(mu_t, pi_t),   s_t = grad_z D_t . (e_{y_t} - pi_t)      (module docstring)
        mask_t = 0  iff  D_t > delta  and  A_t s_t > 0,   weights = mask

    Needs ``RatioInput.dists`` (:class:`TokenDistributions`: pi and mu log-probs over K ids,
    K = V for full distributions, or the engine's top-K) and ``RatioInput.advantages``
    (``[B]`` or ``[B, T]``, only the sign is used). The sampled token's own log-probs come
    from ``logp`` (pi) and ``rollout_logp`` (mu; ``old_logp`` when absent). Shapes ``[B, T]``.
    Metrics: ``pdm_masked_frac``, ``pdm_outside_frac`` (D > delta), ``pdm_ratio_disagree_frac``
    (tokens outside the region where PPO's ratio test, A (r - 1) > 0 with r = pi/mu,
    disagrees with the predicted direction).
    Memory: the closed forms hold float64 ``[rows, T, K + 2]`` temporaries; the entry
    processes the batch in row chunks of about ``CHUNK_ELEMENTS`` (B T K) elements, so
    the peak extra memory does not grow with B (one chunk per call for small inputs).
    """
    if inp.dists is None or inp.advantages is None:
        raise ValueError(
            "predictive_divergence_mask needs RatioInput.dists (TokenDistributions) "
            "and RatioInput.advantages"
        )
    m = inp.mask.float()
    mu_y = inp.rollout_logp if inp.rollout_logp is not None else inp.old_logp
    d = inp.dists
    B, T, K = d.logp.shape
    rows = max(1, CHUNK_ELEMENTS // max(1, T * K))  # memory chunking, not per-row math
    parts = [
        topk_predictive_divergence(
            d.logp[i : i + rows].detach(),
            d.old_logp[i : i + rows].detach(),
            d.sampled_index[i : i + rows],
            inp.logp[i : i + rows].detach(),
            mu_y[i : i + rows].detach(),
            p.divergence,
            p.estimator,
        )
        for i in range(0, B, rows)
    ]
    pred = DivergencePrediction(
        torch.cat([q.divergence for q in parts]) if parts else d.logp.new_zeros(B, T),
        torch.cat([q.direction for q in parts]) if parts else d.logp.new_zeros(B, T),
    )
    A = broadcast_advantages(inp.advantages, m)
    outside = pred.divergence > p.threshold
    grows = A * pred.direction > 0
    keep = (~(outside & grows)).float() * m
    ratio_grows = A * (inp.logp.detach() - mu_y.detach()) > 0
    of = outside.float() * m
    return CorrectionOutput(
        keep.clone(),
        keep,
        {
            "pdm_masked_frac": 1.0 - masked_mean(keep, m).item(),
            "pdm_outside_frac": masked_mean(outside.float(), m).item(),
            "pdm_ratio_disagree_frac": masked_mean((ratio_grows != grows).float(), of).item(),
            "pdm_divergence_mean": masked_mean(pred.divergence.float(), m).item(),
        },
    )
