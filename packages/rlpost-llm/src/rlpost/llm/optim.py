"""The trainers' optimiser, from ``OptimConfig`` through ``rlpost.core.optim.OPTIMIZERS``."""

from __future__ import annotations

import torch

from rlpost.core.optim import OPTIMIZERS, OptimizerInput
from rlpost.llm.config import OptimConfig


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
