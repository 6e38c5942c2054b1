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

``strategy="fsdp2"``: the parameters are sharded over the ranks instead of replicated
(``torch.distributed.fsdp.fully_shard``: each decoder layer a unit, the :class:`Forward`
wrapper the root, so the embeddings and head are gathered for every forward whichever
function it runs); gradients are reduce-scattered, averaged like DDP's, and the optimiser
steps on each rank's shard. Whole weights exist only when asked for, collectively:
:meth:`Learner.full_state_dict` (the rollout engine's copy, checkpoints) and
:meth:`Learner.optimizer_state` / :meth:`Learner.load_optimizer_state` in the checkpoint's
one-process layout, so an FSDP2 run's checkpoints are a one-process run's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rlpost.core import pick_device


def launched() -> bool:
    """Whether this process is one of several ranks a launcher started (``torchrun`` sets
    ``WORLD_SIZE``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def end_rank(code: int) -> NoReturn:
    """End a launched rank's process with ``code`` once its run has closed: its output
    flushed, then ``os._exit``, without the interpreter's teardown.

    torch's C++ threads outlive a rank's run: after FSDP2 the gloo group's worker threads
    run on past ``destroy_process_group`` (even once the model is freed), and FSDP2's
    backward on CPU starts autograd's device threads. One that meets the interpreter while
    it is torn down ends the process with ``std::terminate`` ('terminate called without an
    active exception', SIGABRT): CI saw it twice, on a rank whose run had finished, after
    the barrier that follows rank 0's last checkpoint, so the launcher reported a finished
    run as failed. By the time this is called nothing is left to do: the checkpoint is
    written (atomically), the logger closed, the group destroyed; the rlpost packages
    register no exit handlers."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed or broken
            stream.flush()
    logging.shutdown()
    os._exit(code)


class Ranks:
    """This process among the run's ranks: started from ``WORLD_SIZE`` (``torchrun``),
    gloo on CPU and NCCL on GPU. ``device``: the policy's; ``comm``: where the trainer's
    own collectives' tensors live (this rank's GPU under NCCL)."""

    def __init__(self, device: str):
        self.world, self.rank = 1, 0
        self.own_group = False  # this process started the group (close ends it)
        if launched() and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            self.own_group = True
        if dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.device = pick_device(device)
        self.comm = torch.device("cpu")
        if self.world > 1 and dist.get_backend() == "nccl":  # NCCL: on this rank's GPU
            self.comm = self.device
            torch.cuda.set_device(self.device)
        self.main = self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def past(self, t_start: float, budget: float) -> bool:
        """Past the wall-clock budget (rank 0's clock decides for every rank)."""
        flag = torch.tensor([float(time.perf_counter() - t_start >= budget)], device=self.comm)
        if self.world > 1:
            dist.broadcast(flag, src=0)
        return bool(flag.item())

    def finish(self) -> None:
        """Every rank waits here for rank 0's last checkpoint: a rank that tore down its
        gloo group while rank 0 still wrote once aborted."""
        if self.own_group:
            dist.barrier()

    def close(self) -> None:
        if self.own_group and dist.is_initialized():  # (no rank exits with gloo threads up)
            dist.destroy_process_group()
            self.own_group = False


class Forward(torch.nn.Module):
    """``forward(fn, *args, **kwargs) -> fn(module, *args, **kwargs)``: a function of the
    wrapped module as that module's forward, for DDP's hooks."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.module, *args, **kwargs)


def _decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks FSDP2 shards as units (a causal LM's decoder layers)."""
    get_dec = getattr(module, "get_decoder", None)
    dec = get_dec() if get_dec is not None else None
    layers = getattr(dec, "layers", None)
    return list(layers) if layers is not None else []


def shards(strategy: str, world: int) -> bool:
    """Whether ``train.parallel: strategy`` over ``world`` ranks shards the weights."""
    return world > 1 and strategy == "fsdp2"


class Learner:
    """``module``'s differentiable forwards, data-parallel over the initialised process
    group (DDP, or FSDP2 with ``strategy="fsdp2"``; gloo on CPU and NCCL on GPU), plain on
    one process."""

    def __init__(self, module: torch.nn.Module, strategy: str = "ddp"):
        if strategy not in ("ddp", "fsdp2"):
            raise ValueError(f"strategy must be ddp or fsdp2, got {strategy!r}")
        self.module = module
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.sharded = shards(strategy, self.world)
        fwd = Forward(module)
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            with torch.no_grad():  # rank 0's weights everywhere, then each keeps its shard
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t.data, src=0)
            for layer in _decoder_layers(module):
                fully_shard(layer)
            fully_shard(fwd)
            self._fwd: torch.nn.Module = fwd
        else:  # rank 0's weights are broadcast at construction, so every rank starts equal
            self._fwd = (
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
        if self.sharded:
            self._fwd.set_requires_gradient_sync(last)
        elif self.world > 1:
            self._fwd.require_backward_grad_sync = last

    def micro_batches(self, rows: torch.Tensor, size: int, fallback: torch.Tensor):
        """``(rows, weight)`` chunks of ``rows``. A rank with no rows still takes part in
        the synchronised backward: one ``fallback`` row at weight 0."""
        if len(rows) == 0 and self.world > 1:
            return [(fallback[:1], 0.0)]
        return [(rows[s : s + size], 1.0) for s in range(0, len(rows), size)]

    # ---------------------------------------------------------------- FSDP2's whole state
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole weights, on CPU, on rank 0 (other ranks: ``{}``); collective under
        FSDP2, the module's own state dict otherwise."""
        if not self.sharded:
            return self.module.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.module, options=opts)

    def _order(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The parameter names in the optimiser's own index order."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimiser's whole state in ``optimizer.state_dict()``'s layout (integer
        parameter ids), on rank 0 (other ranks: ``{}``); collective under FSDP2."""
        if not self.sharded:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_optimizer_state_dict(self.module, optimizer, options=opts)
        if not sd:
            return {}
        index = {n: i for i, n in enumerate(self._order(optimizer))}
        return {
            "state": {index[n]: st for n, st in sd["state"].items()},
            "param_groups": [
                {**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]
            ],
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, sd: dict) -> None:
        """Load :meth:`optimizer_state`'s layout (every rank holding the whole of it)."""
        if not self.sharded:
            optimizer.load_state_dict(sd)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        order = self._order(optimizer)
        fqn = {
            "state": {order[int(i)]: st for i, st in sd["state"].items()},
            "param_groups": [
                {**g, "params": [order[int(i)] for i in g["params"]]} for g in sd["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            self.module, optimizer, fqn, options=StateDictOptions(full_state_dict=True)
        )

    def load_full_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load whole weights (every rank holding them): each rank keeps its shard."""
        if not self.sharded:
            self.module.load_state_dict(sd)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        missing, unexpected = set_model_state_dict(
            self.module, sd, options=StateDictOptions(full_state_dict=True, strict=False)
        )
        tied = {n for n, _ in self.module.named_parameters(remove_duplicate=False)} - {
            n for n, _ in self.module.named_parameters()
        }
        if set(missing) - tied or unexpected:
            raise RuntimeError(
                f"checkpoint weights do not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
