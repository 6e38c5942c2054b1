"""On-policy distillation: per-token reverse KL from the student to a teacher.

The student samples ``y_t ~ pi_s(. | x, y_<t)``; at every response position the loss is
the reverse KL ``KL(pi_s || pi_t) = sum_v pi_s(v) d(v)`` with ``d(v) = log pi_s(v) -
log pi_t(v)``. Its gradient (the teacher frozen, ``sum_v grad pi_s(v) = 0``) is

    grad KL = sum_v d(v) grad pi_s(v) = sum_v pi_s(v) d(v) grad log pi_s(v).

Three estimators of the value and of that gradient (``DISTILL_ESTIMATORS``), all sharing
one surrogate: gradient ``sum_{v in K} pi_s(v) d(v) grad log pi_s(v)`` over an id set K
plus ``1[y not in K] d(y) grad log pi_s(y)`` for the sampled token:

* ``full``: K is the whole vocabulary (exact value and gradient);
* ``topk``: K is a top-K id set chosen without looking at ``y`` (the teacher's top-K):
  exact on K, the tail ``sum_{v not in K}`` estimated by the sampled token, so value and
  gradient are unbiased for any K (equal to ``full`` when K covers the vocabulary);
* ``sampled``: K empty: value ``d(y)`` and gradient ``d(y) grad log pi_s(y)`` (REINFORCE
  with the per-token reward ``-d(y)``; needs only the teacher's log-prob of the sampled
  token, which any engine that scores prompts gives).

In expectation over ``y ~ pi_s`` all three have the value and the gradient of ``full``;
when the student equals the teacher, ``d = 0`` and value and gradient are exactly zero
for every sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.registry import Registry


@dataclass(frozen=True)
class TeacherDistributions:
    """The student's and the teacher's log-probs over the same K ids per position.

    ``student`` ``[B, T, K]``: log pi_s of the ids (differentiable: the training forward's);
    ``teacher`` ``[B, T, K]``: log pi_t of the same ids (detached); ``sampled_index``
    ``[B, T]`` long: column of the sampled token among the K ids, -1 when absent. For the
    full vocabulary K = V and the ids are the vocabulary.
    """

    student: Tensor
    teacher: Tensor
    sampled_index: Tensor

    def __post_init__(self) -> None:
        if self.student.dim() != 3 or self.teacher.shape != self.student.shape:
            raise ValueError(
                f"teacher_dists: student {tuple(self.student.shape)} and teacher "
                f"{tuple(self.teacher.shape)} must be the same [B, T, K]"
            )
        if self.sampled_index.shape != self.student.shape[:2]:
            raise ValueError(
                f"teacher_dists.sampled_index must be [B, T] = {tuple(self.student.shape[:2])}"
                f", got {tuple(self.sampled_index.shape)}"
            )
        if self.sampled_index.dtype.is_floating_point:
            raise ValueError("teacher_dists.sampled_index must be an integer tensor")


@dataclass(frozen=True)
class DistillInput:
    """``logp`` ``[B, T]``: log pi_s of the sampled tokens (differentiable); ``mask``
    ``[B, T]``: the tokens distilled; ``teacher_logp`` ``[B, T]``: log pi_t of the sampled
    tokens (``Input.TEACHER_LOGPROBS``); ``topk`` / ``full``: both over the teacher's
    top-K ids (``Input.TEACHER_TOPK``) / over the whole vocabulary (``Input.TEACHER_FULL``);
    ``spans`` ``[B, T]`` long: the text block of each token when the teacher tokenised the
    text differently (``Input.TEACHER_SPANS``, see :func:`block_gap`); the teacher's
    log-prob of a block is the sum of ``teacher_logp`` over the block's tokens."""

    logp: Tensor
    mask: Tensor
    teacher_logp: Tensor | None = None
    topk: TeacherDistributions | None = None
    full: TeacherDistributions | None = None
    spans: Tensor | None = None

    def __post_init__(self) -> None:
        if self.mask.shape != self.logp.shape:
            raise ValueError(f"mask {tuple(self.mask.shape)} != logp {tuple(self.logp.shape)}")
        t = self.teacher_logp
        if t is not None and t.shape != self.logp.shape:
            raise ValueError(f"teacher_logp {tuple(t.shape)} != logp {tuple(self.logp.shape)}")
        for name in ("topk", "full"):
            d = getattr(self, name)
            if d is not None and tuple(d.student.shape[:2]) != tuple(self.logp.shape):
                raise ValueError(
                    f"{name} distributions [B, T] = {tuple(d.student.shape[:2])} != logp "
                    f"{tuple(self.logp.shape)}"
                )


@dataclass(frozen=True)
class DistillOutput:
    loss: Tensor  # [B, T] per-token surrogate (value = the estimate), 0 where masked
    kl: Tensor  # [B, T] the detached estimate of KL(pi_s || pi_t), 0 where masked


DISTILL_ESTIMATORS: Registry[DistillInput, DistillOutput] = Registry(
    "distillation estimator",
    DistillInput,
    DistillOutput,
    inputs={
        Input.TEACHER_LOGPROBS: ("teacher_logp",),
        Input.TEACHER_TOPK: ("topk",),
        Input.TEACHER_FULL: ("full",),
        Input.TEACHER_SPANS: ("spans",),
    },
    gated=(Input.TEACHER_LOGPROBS, Input.TEACHER_TOPK, Input.TEACHER_FULL, Input.TEACHER_SPANS),
)


def surrogate(value: Tensor, grad_coef: Tensor, logp: Tensor) -> Tensor:
    """A loss whose value is ``value`` (detached) and whose gradient is
    ``grad_coef * grad logp`` (``grad_coef`` detached), elementwise."""
    return value.detach() + grad_coef.detach() * (logp - logp.detach())


def _gap(student: Tensor, teacher: Tensor, clamp: float | None, keep: Tensor) -> Tensor:
    """``log pi_s - log pi_t`` (detached), exactly 0 where ``keep`` is 0 (padding's
    ``-inf`` never reaches the loss or its gradient), clamped to +-``clamp``."""
    d = student.detach() - teacher.detach()
    d = torch.where(keep > 0, d, torch.zeros_like(d))
    return d if clamp is None else d.clamp(-clamp, clamp)


def _kept(logp: Tensor, keep: Tensor) -> Tensor:
    """``logp`` where ``keep``, else 0 (a differentiable path only through kept entries)."""
    return torch.where(keep > 0, logp, torch.zeros_like(logp))


def block_gap(inp: DistillInput, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-tokenizer blocks: ``(value, coefficient)`` ``[B, T]``. A block's gap
    ``d_k = sum_{i in k} log pi_s(y_i) - log pi_t(block k)`` (the teacher's block log-prob
    is the sum of ``teacher_logp`` over the block); each token of the block gets the
    gradient coefficient ``d_k`` (so the block's gradient is ``d_k grad log pi_s(block)``,
    REINFORCE on the block) and the value ``d_k / |k|`` (the block's value once)."""
    assert inp.spans is not None and inp.teacher_logp is not None
    B = inp.logp.shape[0]
    sp = torch.where(keep > 0, inp.spans.long(), torch.full_like(inp.spans.long(), -1))
    idx = sp.clamp_min(0)
    k = int(idx.max()) + 1 if idx.numel() else 1
    live = (sp >= 0).to(inp.logp.dtype)
    s_lp = torch.where(keep > 0, inp.logp.detach(), torch.zeros_like(inp.logp)) * live
    t_lp = torch.where(keep > 0, inp.teacher_logp.detach(), torch.zeros_like(inp.logp)) * live
    z = inp.logp.new_zeros(B, k)
    d = z.scatter_add(1, idx, s_lp) - z.scatter_add(1, idx, t_lp)
    n = z.scatter_add(1, idx, live).clamp_min(1.0)
    coef = d.gather(1, idx) * live
    return coef / n.gather(1, idx), coef


def sampled_term(
    inp: DistillInput, clamp: float | None, outside: Tensor | None = None, blocks: bool = False
) -> Tensor:
    """``1[y not in K] * (value d(y), gradient d(y) grad log pi_s(y))`` ``[B, T]`` (all of
    the sampled estimator; the tail of top-K when ``outside`` marks y not in K); with
    ``blocks`` on ``inp.spans``' text blocks (:func:`block_gap`)."""
    assert inp.teacher_logp is not None
    keep = inp.mask if outside is None else inp.mask * outside
    if blocks:
        value, coef = block_gap(inp, keep)
        if clamp is not None:
            value, coef = value.clamp(-clamp, clamp), coef.clamp(-clamp, clamp)
        return surrogate(value, coef, _kept(inp.logp, keep))
    d = _gap(inp.logp, inp.teacher_logp, clamp, keep)
    return surrogate(d, d, _kept(inp.logp, keep))


def exact_term(inp: DistillInput, dists: TeacherDistributions, clamp: float | None) -> Tensor:
    """``sum_{v in K}``: value ``pi_s(v) d(v)``, gradient ``pi_s(v) d(v) grad log pi_s(v)``
    ``[B, T]``."""
    s = dists.student
    keep = inp.mask[..., None].expand_as(s)
    p = torch.where(keep > 0, s.detach(), torch.full_like(s, -torch.inf)).exp()
    w = p * _gap(s, dists.teacher, clamp, keep)
    return surrogate(w, w, _kept(s, keep)).sum(-1)


def finish(loss: Tensor, mask: Tensor) -> DistillOutput:
    m = mask.to(loss.dtype)
    loss = torch.where(m > 0, loss, torch.zeros_like(loss)) * m
    return DistillOutput(loss, loss.detach())


__all__ = [
    "DISTILL_ESTIMATORS",
    "DistillInput",
    "DistillOutput",
    "TeacherDistributions",
    "block_gap",
    "exact_term",
    "finish",
    "sampled_term",
    "surrogate",
]
