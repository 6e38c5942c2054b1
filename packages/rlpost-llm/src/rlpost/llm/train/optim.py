"""The trainers' optimiser, from ``OptimConfig`` through ``rlpost.core.optim.OPTIMIZERS``,
and its learning-rate schedule."""

from __future__ import annotations

import math

import torch

from rlpost.core.optim import OPTIMIZERS, OptimizerInput
from rlpost.llm.train.config import OptimConfig


def embedding_names(model: torch.nn.Module) -> set[str]:
    """Parameter names of the input embedding and the output head (tied or not): matrices
    that a matrix optimiser (Muon, Pion) is not meant for."""
    ids = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        mod = getattr(model, get, lambda: None)()
        w = getattr(mod, "weight", None)
        if w is not None:
            ids.add(id(w))
    return {n for n, p in model.named_parameters() if id(p) in ids}


def build_optimizer(model: torch.nn.Module, o: OptimConfig) -> torch.optim.Optimizer:
    """The configured ``OPTIMIZERS`` entry over ``model``'s trainable parameters."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    inp = OptimizerInput.split(named, embedding_names(model), lr=o.lr, weight_decay=o.weight_decay)
    return OPTIMIZERS.build(o.name, **o.entry_params())(inp)


def lr_schedule(schedule: str, warmup: int, total: int):
    """``LambdaLR`` factor: linear warmup over ``warmup`` steps, then constant, linear or
    cosine decay to 0 at ``total``."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - frac
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * frac))
        return 1.0

    return f
