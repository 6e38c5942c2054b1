"""The ``OPTIMIZERS`` entries: AdamW, Muon and Pion (000-14)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.core.optim.base import OPTIMIZERS, OptimizerInput
from rlpost.core.optim.matrix import Muon, Pion


@dataclass(frozen=True)
class AdamWParams:
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not all(0 <= b < 1 for b in self.betas) or self.eps <= 0:
            raise ValueError(f"need betas in [0, 1) and eps > 0, got {self}")


@OPTIMIZERS.register("adamw", AdamWParams)
def adamw(inp: OptimizerInput, p: AdamWParams) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` over every parameter (the default), with torch's fused kernel
    where it exists for the parameters (CPU and CUDA floats): torch's own default on CPU
    is the per-tensor loop, several times slower for a model of many small tensors."""
    params = [*inp.matrix, *inp.other]
    fused = bool(params) and all(
        q.device.type in ("cpu", "cuda") and q.dtype in _FUSED_DTYPES for q in params
    )
    return torch.optim.AdamW(
        params,
        lr=inp.lr,
        betas=tuple(p.betas),
        eps=p.eps,
        weight_decay=inp.weight_decay,
        fused=fused or None,
    )


_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class MatrixParams:
    matrix_lr: float = 0.02  # learning rate of the matrix update (Muon's usual 0.02)
    momentum: float = 0.95
    nesterov: bool = True
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW of the other parameters (lr: the base)
    ns_steps: int = 5  # Muon: Newton-Schulz steps
    promote_steps: int = 2  # Pion: promotion steps (the cut, see pion_cut)
    suppress_steps: int = 5  # Pion: suppression steps (the sharpness)

    def __post_init__(self) -> None:
        if self.matrix_lr <= 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"need matrix_lr > 0 and momentum in [0, 1), got {self}")
        if min(self.ns_steps, self.suppress_steps) < 1 or self.promote_steps < 0:
            raise ValueError(f"need ns_steps, suppress_steps >= 1, promote_steps >= 0, got {self}")


def _groups(inp: OptimizerInput, p: MatrixParams) -> list[dict]:
    groups = [{"params": list(inp.matrix)}] if inp.matrix else []
    if inp.other:
        groups.append(
            {"params": list(inp.other), "adam": True, "lr": inp.lr, "betas": tuple(p.betas)}
        )
    return groups


@OPTIMIZERS.register("muon", MatrixParams)
def muon(inp: OptimizerInput, p: MatrixParams) -> torch.optim.Optimizer:
    """:class:`~rlpost.core.optim.matrix.Muon` on the matrices (``matrix_lr``), AdamW on
    the rest (the base ``lr``); ``promote_steps`` / ``suppress_steps`` are unused."""
    return Muon(
        _groups(inp, p),
        lr=p.matrix_lr,
        momentum=p.momentum,
        nesterov=p.nesterov,
        ns_steps=p.ns_steps,
        weight_decay=inp.weight_decay,
    )


@OPTIMIZERS.register("pion", MatrixParams)
def pion(inp: OptimizerInput, p: MatrixParams) -> torch.optim.Optimizer:
    """:class:`~rlpost.core.optim.matrix.Pion` (catalog 000-14) on the matrices, AdamW on
    the rest; ``ns_steps`` is unused."""
    return Pion(
        _groups(inp, p),
        lr=p.matrix_lr,
        momentum=p.momentum,
        nesterov=p.nesterov,
        promote_steps=p.promote_steps,
        suppress_steps=p.suppress_steps,
        weight_decay=inp.weight_decay,
    )
