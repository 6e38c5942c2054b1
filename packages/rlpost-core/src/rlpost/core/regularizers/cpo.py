"""CPO (catalog 004-18): a replay-free penalty on drift from prior tasks, with a sparse
Fisher surrogate from parameter movement."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.regularizers.base import REGULARIZERS, GradientInput, GradientOutput


def movement_fisher(
    start: Sequence[Tensor], end: Sequence[Tensor], density: float = 0.1
) -> list[Tensor]:
    """CPO (catalog 004-18) Fisher surrogate of one finished task from parameter movement.

    ``start`` / ``end``: the parameters before and after training on the task. With
    ``delta = end - start`` over all ``N`` entries of all tensors:

        F_i = delta_i^2 / mean_j delta_j^2      for the k = ceil(density N) largest delta_i^2
        F_i = 0                                 otherwise (sparse regulariser)

    Rationale (the abstract's "parameter movement as a gradient-free proxy for Fisher
    sensitivity"): entries the prior task pushed far are the ones its objective was
    sensitive to; normalising by the mean makes ``F`` unit-free, so one coefficient fits
    every model. Ties at the cut are all kept. No movement at all gives ``F = 0``.

    Memory: besides the float32 ``delta^2`` tensors it returns (as ``F``, in place), it
    allocates no copy of all N entries: the mean is a float64 sum over the tensors and the
    exact k-th largest value is found by a binary search on its float32 bit pattern (31
    counting passes, :func:`_kth_largest`), not by a ``topk`` over the concatenation.
    """
    if len(start) != len(end) or any(a.shape != b.shape for a, b in zip(start, end, strict=True)):
        raise ValueError("start and end must hold tensors of the same shapes")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    sq = [
        (b.detach().float() - a.detach().float()).square_() for a, b in zip(start, end, strict=True)
    ]
    n = sum(s.numel() for s in sq)
    total = sum(float(s.sum(dtype=torch.float64)) for s in sq)
    if total == 0:
        return [s.zero_() for s in sq]
    mean = total / n
    cut = _kth_largest(sq, max(1, math.ceil(density * n)))
    return [s.masked_fill_(s < cut, 0.0).div_(mean) for s in sq]


def _kth_largest(values: Sequence[Tensor], k: int) -> float:
    """Exact k-th largest entry of non-negative float32 tensors, without concatenating them.

    Non-negative float32 values order like their int32 bit patterns, so the largest bit
    pattern ``v`` with ``#{x >= v} >= k`` is found by bisection over [0, 2^31): each step
    counts over every tensor (a bool temporary per tensor, no copy of all entries)."""
    lo, hi = 0, (1 << 31) - 1  # invariant: count(bits >= lo) >= k > count(bits > hi)
    bits = [v.reshape(-1).view(torch.int32) for v in values]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(int((b >= mid).sum()) for b in bits) >= k:
            lo = mid
        else:
            hi = mid - 1
    return float(torch.tensor(lo, dtype=torch.int32).view(torch.float32))


class CPORegularizer:
    """CPO (catalog 004-18): replay-free penalty on behavioural drift from prior tasks.

    The prior-task KL ``KL(pi_anchor || pi_theta)`` is locally
    ``(1/2) (theta - theta*)^T F (theta - theta*)``; CPO replaces ``F`` by the diagonal
    movement surrogate of :func:`movement_fisher`, summed over the finished tasks:

        R(theta) = (coef / 2) sum_i F_i (theta_i - theta*_i)^2,
        grad R   = coef F (theta - theta*)        (0 at the anchor theta*)

    ``theta*`` are the parameters at the end of the last finished task. Use:
    ``reg.begin_task()`` before a task, ``reg.end_task()`` after it, and
    ``loss = task_loss + reg.penalty()`` while training on later tasks. The penalty is 0
    until a task has ended.
    """

    def __init__(self, params: Iterable[Tensor], coef: float = 1.0, density: float = 0.1):
        if coef < 0:
            raise ValueError(f"coef must be >= 0, got {coef}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must lie in (0, 1], got {density}")
        self.params = list(params)
        self.coef, self.density = coef, density
        self.fisher: list[Tensor] | None = None
        self.anchor: list[Tensor] | None = None
        self._start: list[Tensor] | None = None

    def begin_task(self) -> None:
        self._start = [p.detach().clone() for p in self.params]

    def end_task(self) -> None:
        if self._start is None:
            raise RuntimeError("end_task() without begin_task()")
        f = movement_fisher(self._start, [p.detach() for p in self.params], self.density)
        self.fisher = (
            f if self.fisher is None else [a + b for a, b in zip(self.fisher, f, strict=True)]
        )
        self.anchor = [p.detach().clone() for p in self.params]
        self._start = None

    def penalty(self) -> Tensor:
        if self.fisher is None or self.anchor is None:
            return self.params[0].new_zeros(())
        total = sum(
            (f * (p - a) ** 2).sum()
            for p, f, a in zip(self.params, self.fisher, self.anchor, strict=True)
        )
        return 0.5 * self.coef * total

    def state_dict(self) -> dict:
        """Fisher, anchor and, mid-task, the task's start parameters (so that a run resumed
        between ``begin_task()`` and ``end_task()`` can still end the task)."""
        return {"fisher": self.fisher, "anchor": self.anchor, "start": self._start}

    def load_state_dict(self, state: dict) -> None:
        self.fisher, self.anchor = state["fisher"], state["anchor"]
        self._start = state.get("start")  # absent in states saved before it was recorded


@dataclass(frozen=True)
class CPOParams:
    coef: float = 1.0
    density: float = 0.1

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"coef must be >= 0, got {self.coef}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must lie in (0, 1], got {self.density}")


@REGULARIZERS.register("cpo", CPOParams, needs={Input.PARAMETERS, Input.TASK_BOUNDARY})
def cpo(inp: GradientInput, p: CPOParams) -> GradientOutput:
    """CPO (catalog 004-18) as a gradient transform over a sequence of tasks:

        g = grad + coef F (theta - theta*)        (the gradient of :class:`CPORegularizer`'s
                                                   penalty added to the task gradient)

    ``task_boundary == "begin"`` records the task's starting parameters; ``"end"`` adds the
    finished task's :func:`movement_fisher` to ``F`` and sets the anchor ``theta*`` to the
    current parameters. Before any task has ended the gradient is unchanged. ``state``:
    ``fisher``, ``anchor``, ``start`` (flat ``[D]`` tensors or ``None``).
    """
    theta = inp.parameters.detach()
    st = dict(inp.state)
    fisher, anchor, start = st.get("fisher"), st.get("anchor"), st.get("start")
    if inp.task_boundary == "begin":
        start = theta.clone()
    elif inp.task_boundary == "end":
        if start is None:
            raise ValueError("cpo: a task ended that never began (task_boundary 'begin' missing)")
        f = movement_fisher([start], [theta], p.density)[0]
        fisher = f if fisher is None else fisher + f
        anchor, start = theta.clone(), None
    g, metrics = inp.grad, {}
    if fisher is not None and anchor is not None:
        pull = p.coef * fisher.to(g.dtype) * (theta - anchor).to(g.dtype)
        g = g + pull
        metrics["cpo/penalty"] = float(0.5 * (pull * (theta - anchor)).sum())
    return GradientOutput(g, {"fisher": fisher, "anchor": anchor, "start": start}, metrics)
