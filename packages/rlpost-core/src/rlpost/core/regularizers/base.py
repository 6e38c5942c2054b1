"""Gradient regularisers (the ``REGULARIZERS`` registry): transforms of a training step's
gradient that use more than the policy loss (an auxiliary data set, the parameters, a
sequence of tasks).

Signature ``fn(GradientInput, params) -> GradientOutput``. Every vector is flat ``[D]``
over the parameters the trainer regularises (:func:`flat_grad` / :func:`set_flat_grad_`
convert from and to ``p.grad``; a subset such as the LoRA parameters keeps ``D`` small).
Stateful regularisers (GAC's controller, CPO's Fisher and anchor) are pure functions of
an explicit ``state`` the trainer passes back each call and checkpoints with the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.registry import Registry


def flat_grad(params: Iterable[Tensor]) -> Tensor:
    """Concatenate ``p.grad`` (zeros where ``None``) of ``params`` into one ``[D]`` vector."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def set_flat_grad_(params: Sequence[Tensor], flat: Tensor) -> None:
    """Write the ``[D]`` vector ``flat`` back into ``p.grad`` (inverse of :func:`flat_grad`)."""
    n = sum(p.numel() for p in params)
    if flat.shape != (n,):
        raise ValueError(f"flat gradient has shape {tuple(flat.shape)}, parameters hold {n}")
    i = 0
    for p in params:
        g = flat[i : i + p.numel()].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        i += p.numel()


@dataclass(frozen=True)
class GradientInput:
    """A training step's gradient and what a regulariser may read beyond it.

    * ``grad`` ``[D]``: the step's policy-loss gradient (flat);
    * ``aux_grads`` ``[M, D]``: gradients of ``M`` batches of an auxiliary data set (GAC's
      SFT data, Dr. Post-Training's general data), each the mean over its batch;
    * ``grad_samples`` ``[K, D]``: ``K`` unbiased samples of ``grad`` (per-micro-batch
      gradients, each rescaled to the whole batch), whose mean is ``grad``;
    * ``parameters`` ``[D]``: the current parameters (CPO's drift penalty);
    * ``task_boundary``: ``"begin"`` / ``"end"`` when a task of a continual sequence starts
      or ends at this step (before this step's update), else ``None``;
    * ``state``: the entry's own state returned by its previous call (empty at first).
    """

    grad: Tensor
    aux_grads: Tensor | None = None
    grad_samples: Tensor | None = None
    parameters: Tensor | None = None
    task_boundary: Literal["begin", "end"] | None = None
    state: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.grad.dim() != 1:
            raise ValueError(f"grad must be flat [D], got {tuple(self.grad.shape)}")
        D = self.grad.shape[0]
        for name in ("aux_grads", "grad_samples"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[1] != D):
                raise ValueError(f"{name} must be [M, D={D}], got {tuple(t.shape)}")
        if self.parameters is not None and self.parameters.shape != (D,):
            raise ValueError(f"parameters must be [D={D}], got {tuple(self.parameters.shape)}")
        if self.task_boundary not in (None, "begin", "end"):
            raise ValueError(
                f"task_boundary must be 'begin', 'end' or None, got {self.task_boundary!r}"
            )


@dataclass(frozen=True)
class GradientOutput:
    grad: Tensor  # [D] the gradient to apply
    state: dict[str, Any] = field(default_factory=dict)  # pass back next call; checkpoint it
    metrics: dict[str, float] = field(default_factory=dict)


REGULARIZERS: Registry[GradientInput, GradientOutput] = Registry(
    "gradient regularizer",
    GradientInput,
    GradientOutput,
    inputs={
        Input.AUX_GRADIENTS: ("aux_grads",),
        Input.GRAD_SAMPLES: ("grad_samples",),
        Input.PARAMETERS: ("parameters",),
        Input.TASK_BOUNDARY: ("task_boundary",),
    },
    gated=(Input.AUX_GRADIENTS, Input.GRAD_SAMPLES, Input.PARAMETERS, Input.TASK_BOUNDARY),
    # a boundary is an event, absent on most steps: declaring it means "reads the events"
    present={Input.TASK_BOUNDARY: lambda inp: True},
)


__all__ = [
    "REGULARIZERS",
    "GradientInput",
    "GradientOutput",
    "flat_grad",
    "set_flat_grad_",
]
