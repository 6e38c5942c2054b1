"""The three reverse-KL estimators of on-policy distillation (see :mod:`.base`), and the
Jensen-Shannon divergence of SD-Search (catalog 000-16) over the vocabulary or a top-K."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlpost.core.contract import Input
from rlpost.core.distill.base import (
    DISTILL_ESTIMATORS,
    DistillInput,
    DistillOutput,
    exact_term,
    finish,
    sampled_term,
)


@dataclass(frozen=True)
class DistillParams:
    clamp: float | None = None
    """Bound on |log pi_s - log pi_t| per id (numerical safety against a teacher that
    gives a sampled token almost no mass); None: off."""


@dataclass(frozen=True)
class FullParams(DistillParams):
    mass_tol: float = 1e-3
    """The student's log-probs must cover the vocabulary: their mass may differ from 1 by
    at most this (a top-K passed to ``full`` would silently drop the tail)."""


@DISTILL_ESTIMATORS.register("full", FullParams, needs={Input.TEACHER_FULL})
def full(inp: DistillInput, p: FullParams) -> DistillOutput:
    """Exact reverse KL over the whole vocabulary: ``sum_v pi_s(v) (log pi_s(v) - log
    pi_t(v))`` and its exact gradient (``[B, T, V]`` distributions of both)."""
    assert inp.full is not None
    mass = inp.full.student.detach().exp().sum(-1)
    m = inp.mask > 0
    if m.any() and float((mass[m] - 1).abs().max()) > p.mass_tol:
        raise ValueError(
            "distillation estimator 'full': the student's distributions do not cover the "
            f"vocabulary (mass {float(mass[m].min()):.4f}..{float(mass[m].max()):.4f}); "
            "use 'topk' for a top-K id set"
        )
    return finish(exact_term(inp, inp.full, p.clamp), inp.mask)


@DISTILL_ESTIMATORS.register(
    "topk", DistillParams, needs={Input.TEACHER_TOPK, Input.TEACHER_LOGPROBS}
)
def topk(inp: DistillInput, p: DistillParams) -> DistillOutput:
    """Exact on a top-K id set (the teacher's), the tail estimated by the sampled token
    when it lies outside the K ids: unbiased value and gradient for any K."""
    assert inp.topk is not None
    outside = (inp.topk.sampled_index < 0).to(inp.logp.dtype)
    loss = exact_term(inp, inp.topk, p.clamp) + sampled_term(inp, p.clamp, outside)
    return finish(loss, inp.mask)


@DISTILL_ESTIMATORS.register(
    "sampled", DistillParams, needs={Input.TEACHER_LOGPROBS}, reads={Input.TEACHER_SPANS}
)
def sampled(inp: DistillInput, p: DistillParams) -> DistillOutput:
    """The sampled token alone: value ``log pi_s(y) - log pi_t(y)``, gradient that times
    ``grad log pi_s(y)`` (unbiased for the reverse KL and its gradient under y ~ pi_s).
    With ``spans`` (a teacher with another tokenizer) the same on text blocks: each
    block's gap to the teacher's log-prob of the same text (:func:`.base.block_gap`)."""
    return finish(sampled_term(inp, p.clamp, blocks=inp.spans is not None), inp.mask)


def jsd_term(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, renorm: bool):
    """``[B, T]`` JSD(pi_s, pi_t) = (KL(pi_s || m) + KL(pi_t || m)) / 2, m = (pi_s + pi_t) / 2,
    over the K ids of ``[B, T, K]`` log-probs (``renorm``: both renormalised over them
    first, the top-K form); differentiable in ``student``, 0 with zero gradient where
    ``mask`` is 0, ids of probability 0 contributing 0."""
    keep = (mask > 0)[..., None]
    s = torch.where(keep, student, torch.zeros_like(student))
    t = torch.where(keep, teacher.detach().to(student.dtype), torch.zeros_like(student))
    if renorm:
        s = s - s.logsumexp(-1, keepdim=True)
        t = t - t.logsumexp(-1, keepdim=True)
    log_m = torch.logaddexp(s, t) - math.log(2.0)
    p, q = s.exp(), t.exp()
    a = torch.where(p > 0, p * (s - log_m), torch.zeros_like(p))
    b = torch.where(q > 0, q * (t - log_m), torch.zeros_like(q))
    return torch.where(mask > 0, 0.5 * (a + b).sum(-1), torch.zeros_like(mask, dtype=s.dtype))


@DISTILL_ESTIMATORS.register("jsd", DistillParams, needs={Input.TEACHER_FULL})
def jsd(inp: DistillInput, p: DistillParams) -> DistillOutput:
    """Token-level Jensen-Shannon divergence to the teacher over the whole vocabulary, exact
    (value and gradient): SD-Search's step-level signal (catalog 000-16). Symmetric and at
    most ln 2 per token; ``kl`` reports the JSD."""
    assert inp.full is not None
    return finish(jsd_term(inp.full.student, inp.full.teacher, inp.mask, False), inp.mask)


@DISTILL_ESTIMATORS.register("jsd_topk", DistillParams, needs={Input.TEACHER_TOPK})
def jsd_topk(inp: DistillInput, p: DistillParams) -> DistillOutput:
    """The JSD over the teacher's top-K ids, both distributions renormalised over them (the
    large-vocabulary form of ``jsd``; exact when the K ids hold all the mass)."""
    assert inp.topk is not None
    return finish(jsd_term(inp.topk.student, inp.topk.teacher, inp.mask, True), inp.mask)
