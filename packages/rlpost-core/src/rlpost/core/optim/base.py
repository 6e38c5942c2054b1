"""Optimisers (the ``OPTIMIZERS`` registry): ``fn(OptimizerInput, params) -> torch.optim.Optimizer``.

A trainer hands over its trainable parameters split in two: ``matrix``, the hidden-layer
weight matrices a matrix optimiser (Muon, Pion) orthogonalises or filters, and ``other``
(embeddings, output heads, norms, biases), which every entry updates with AdamW. The
base learning rate ``lr`` and ``weight_decay`` are the trainer's; entries add their own
parameters (validated at build time like every registry).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.registry import Registry


@dataclass(frozen=True)
class OptimizerInput:
    matrix: tuple[Tensor, ...]  # hidden-layer weight matrices (ndim >= 2)
    other: tuple[Tensor, ...] = ()  # everything else
    lr: float = 1e-4
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if any(p.dim() < 2 for p in self.matrix):
            raise ValueError("OptimizerInput.matrix holds matrices only (ndim >= 2)")
        if not (self.matrix or self.other):
            raise ValueError("no parameters to optimise")

    @classmethod
    def split(
        cls,
        named: list[tuple[str, Tensor]],
        not_matrix: set[str] | frozenset[str] = frozenset(),
        lr: float = 1e-4,
        weight_decay: float = 0.0,
    ) -> OptimizerInput:
        """``named`` ``(name, parameter)`` pairs split by shape: ndim >= 2 and not in
        ``not_matrix`` (e.g. the embedding and output-head weights) -> ``matrix``."""
        matrix = tuple(p for n, p in named if p.dim() >= 2 and n not in not_matrix)
        ids = {id(p) for p in matrix}
        other = tuple(p for _, p in named if id(p) not in ids)
        return cls(matrix, other, lr, weight_decay)


OPTIMIZERS: Registry[OptimizerInput, torch.optim.Optimizer] = Registry(
    "optimizer", OptimizerInput, torch.optim.Optimizer
)

__all__ = ["OPTIMIZERS", "OptimizerInput"]
