"""The learner's data parallelism on torch's own wrapper, ``DistributedDataParallel``.

The trainer's differentiable forwards are not one ``model(...)`` call: the fused log-prob
path runs the decoder and multiplies by the LM-head weight itself, distillation asks for
the log-probs of a teacher's ids, the critic runs its value head. :class:`Forward` makes
any of them a module forward (``forward(fn, *args) = fn(module, *args)``), so DDP's
reducer is prepared on every one and its bucketed, overlapped all-reduce runs in the
backward; gradient accumulation over micro-batches syncs once, on the last one
(:meth:`Learner.sync`).

DDP averages gradients over ranks, while each rank's loss is its share of the globally
normalised loss (the ranks' losses sum to the full batch's): :meth:`Learner.scale` is the
world size, applied to the loss before the backward, so a W-process run equals a
1-process run with the same global batch. On one process nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Forward(torch.nn.Module):
    """``forward(fn, *args, **kwargs) -> fn(module, *args, **kwargs)``: a function of the
    wrapped module as that module's forward, for DDP's hooks."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.module, *args, **kwargs)


class Learner:
    """``module``'s differentiable forwards, data-parallel over the initialised process
    group (DDP, gloo on CPU and NCCL on GPU), plain on one process."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        fwd = Forward(module)
        # rank 0's weights are broadcast at construction, so every rank starts equal
        self._fwd: torch.nn.Module = (
            DistributedDataParallel(fwd, broadcast_buffers=False) if self.world > 1 else fwd
        )

    @property
    def scale(self) -> float:
        """What a rank's share of the global loss is multiplied by before its backward."""
        return float(self.world)

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._fwd(fn, *args, **kwargs)

    def sync(self, last: bool) -> None:
        """Before a micro-batch's forward: its backward all-reduces the accumulated
        gradients only when it is the ``last`` of the update; before that they stay local
        (what ``DistributedDataParallel.no_sync`` does, without a block around the body)."""
        if self.world > 1:
            self._fwd.require_backward_grad_sync = last

    def micro_batches(self, rows: torch.Tensor, size: int, fallback: torch.Tensor):
        """``(rows, weight)`` chunks of ``rows``. A rank with no rows still takes part in
        the synchronised backward: one ``fallback`` row at weight 0."""
        if len(rows) == 0 and self.world > 1:
            return [(fallback[:1], 0.0)]
        return [(rows[s : s + size], 1.0) for s in range(0, len(rows), size)]
