"""FLOP accounting (catalog 004-01, RACE): what a post-training run spends, split into
rollout / search, policy update and reward or feedback models.

The dense-transformer rule of thumb (Kaplan et al.): a token through a model with ``N``
matmul parameters costs ``2 N`` FLOPs forward; backward costs ``2 N`` for the activation
gradients plus ``2 N_trainable`` for the weight gradients, so full fine-tuning is
``6 N`` per token and LoRA about ``4 N``. Attention's ``O(context)`` term is left out (at
the lengths of RL post-training on small models it is a few per cent; RACE's accounting
leaves it out too). ``N`` is every parameter but an untied input embedding table (a
lookup, no matmul); a tied table counts once, as the output head.

:class:`FlopCounter` counts what actually runs: a forward hook on a model's input
embedding sees every token that enters it (``generate``'s decode steps one at a time
with a KV cache, a training forward's whole rows, padding included: compute spent), and
whether gradients are on (a training forward, backpropagated) or off (inference).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["FlopCounter", "flop_params", "forward_flops", "training_flops"]


def flop_params(model: torch.nn.Module) -> tuple[int, int]:
    """``(N, N_trainable)``: the parameters a token's matmuls use, and those of them that
    train (an untied input embedding table counts in neither)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = set()
    if emb is not None and (out is None or out.weight is not emb.weight):
        skip = {id(p) for p in emb.parameters()}
    n = t = 0
    for p in model.parameters():
        if id(p) in skip:
            continue
        n += p.numel()
        t += p.numel() if p.requires_grad else 0
    return n, t


def forward_flops(n_params: int, tokens: int) -> int:
    """``2 N T``: ``tokens`` through a model of ``n_params`` matmul parameters."""
    return 2 * n_params * tokens


def training_flops(n_params: int, n_trainable: int, tokens: int) -> int:
    """Forward and backward: ``(4 N + 2 N_trainable) T`` (``6 N T`` when all train)."""
    return (4 * n_params + 2 * n_trainable) * tokens


class _NoHook:
    """What a copied model's counting hook becomes: nothing (the copy is another model;
    whoever counts it hooks it)."""

    def __call__(self, module: Any, args: tuple, output: Any) -> None:
        return None


class _Hook:
    """The embedding's forward hook of a :class:`FlopCounter`. A deep copy or a pickle of
    the model (an engine's own copy, a reference copy, a Ray worker's) carries a
    :class:`_NoHook` instead: the counter, its lock and its counts stay with the model it
    counts."""

    def __init__(self, counter: FlopCounter):
        self.counter = counter

    def __call__(self, module: Any, args: tuple, output: Any) -> None:
        self.counter._seen(module, args, output)

    def __deepcopy__(self, memo: dict) -> _NoHook:
        return _NoHook()

    def __reduce__(self) -> tuple:
        return (_NoHook, ())


class FlopCounter:
    """FLOPs of the forwards a model runs, by the bucket ``bucket()`` names when each runs
    (see the module docstring): inference forwards cost :func:`forward_flops`, forwards
    with gradients on :func:`training_flops`. ``counts`` maps bucket -> FLOPs; ``close``
    removes the hook."""

    def __init__(self, model: torch.nn.Module, bucket: Callable[[bool], str] | None = None):
        self.n_params, self.n_trainable = flop_params(model)
        self.bucket = bucket or (lambda grad: "train" if grad else "inference")
        self.counts: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self._lock = threading.Lock()  # generation may run in another thread
        emb = model.get_input_embeddings()
        self._handle = emb.register_forward_hook(_Hook(self))

    def _seen(self, module: Any, args: tuple, output: Any) -> None:
        ids = args[0] if args else None
        if not isinstance(ids, torch.Tensor):
            return
        grad = torch.is_grad_enabled()
        tokens = int(ids.numel())
        n, t = self.n_params, self.n_trainable
        cost = training_flops(n, t, tokens) if grad else forward_flops(n, tokens)
        key = self.bucket(grad)
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + cost
            self.tokens[key] = self.tokens.get(key, 0) + tokens

    def take(self) -> dict[str, int]:
        """The counts so far, reset to zero."""
        with self._lock:
            out, self.counts, self.tokens = self.counts, {}, {}
        return out

    def close(self) -> None:
        self._handle.remove()
