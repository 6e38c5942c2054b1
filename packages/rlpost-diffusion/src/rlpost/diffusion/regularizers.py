"""The regulariser registry of the diffusion trainer: ``REGULARIZERS``.

A regulariser is a per-sample penalty ``[B]`` that a training family adds to a method's
loss, ``coef`` times it, and logs under its name. Each reads the current and the frozen
reference's velocity at the same points (:class:`RegInput`); on an SDE replay also the
step's Gaussian under both (the family fills ``step_mean``, ``ref_step_mean`` and
``step_std`` for an entry that declares ``transition=True``).

* ``kl``: the KL to the reference. On an SDE step, between the two Gaussians of the
  transition, ``||mean - mean_ref||^2 / (2 std^2)`` averaged over elements
  (:func:`rlpost.diffusion.objectives.step_mean_kl`); on a re-noised point, the
  velocity regression ``||v - v_ref||^2`` that stands for it.
* ``normguard``: NormGuard's penalty on the velocity-norm ratio ``||v|| / ||v_ref||``
  (:func:`rlpost.diffusion.objectives.normguard`).

A method lists its own (``Method.regularizers``); the run's ``algo.kl_coef`` and
``algo.normguard`` override or add them. Adding one is a function and a
:func:`register_regularizer` call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from rlpost.core.registry import ParamsRegistry
from rlpost.diffusion import objectives as obj


@dataclass(frozen=True)
class RegInput:
    v: Tensor  # [B, ...] the current velocity (differentiable)
    v_ref: Tensor  # [B, ...] the reference's velocity at the same points
    step_mean: Tensor | None = None  # [B, ...] an SDE step's mean under the current policy
    ref_step_mean: Tensor | None = None  # ... under the reference
    step_std: Tensor | None = None  # the step's std (the same for both)


@dataclass(frozen=True)
class Regularizer:
    name: str
    penalty: Callable[[RegInput, Any], Tensor]  # [B]
    params: type  # a frozen dataclass with a ``coef``
    transition: bool = False  # on an SDE replay it reads the step's Gaussians


class RegularizerRegistry(ParamsRegistry[Regularizer]):
    def __init__(self) -> None:
        super().__init__("diffusion regulariser")

    def register(self, reg: Regularizer) -> Regularizer:
        if dataclasses.is_dataclass(reg.params) and "coef" not in {
            f.name for f in dataclasses.fields(reg.params)
        }:
            raise TypeError(f"regulariser {reg.name!r}: params must have a coef")
        return super().register(reg)


REGULARIZERS = RegularizerRegistry()


def register_regularizer(reg: Regularizer) -> Regularizer:
    return REGULARIZERS.register(reg)


@dataclass(frozen=True)
class KLParams:
    coef: float = 0.0

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"coef must be >= 0, got {self.coef}")


def kl(inp: RegInput, p: KLParams) -> Tensor:
    if inp.step_mean is not None:
        return obj.step_mean_kl(inp.step_mean, inp.ref_step_mean, inp.step_std)
    return obj.regression_loss(inp.v, inp.v_ref)


@dataclass(frozen=True)
class NormGuardParams:
    coef: float = 0.0
    form: Literal["hinge", "squared_hinge", "relative"] = "hinge"
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.coef < 0 or self.margin < 0:
            raise ValueError(f"coef and margin must be >= 0, got {self.coef}, {self.margin}")
        if self.form not in ("hinge", "squared_hinge", "relative"):
            raise ValueError(f"form must be hinge, squared_hinge or relative, got {self.form!r}")


def normguard(inp: RegInput, p: NormGuardParams) -> Tensor:
    return obj.normguard(inp.v, inp.v_ref, p.form, p.margin)


register_regularizer(Regularizer("kl", kl, KLParams, transition=True))
register_regularizer(Regularizer("normguard", normguard, NormGuardParams))
