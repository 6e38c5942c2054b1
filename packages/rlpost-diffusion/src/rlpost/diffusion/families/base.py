"""The training-family registry of the diffusion trainer: ``FAMILIES``.

A :class:`Family` is how a sampled batch becomes a method's loss inputs. ``plan(tr, b,
params)`` draws, before any update, everything the step's updates share (which denoising
steps are trained, the re-noising levels and noise) and the positions to train, in
order; the trainer chunks them into minibatches and micro-batches and calls ``loss(tr, b,
plan, positions)`` for each, which builds the :class:`~rlpost.diffusion.methods.
LossInput`, calls the method's loss, adds the run's regularisers and returns the summed
loss of those positions with its metrics. ``tr`` is the trainer (its policy, sigmas,
bound method, sampler and regularisers). ``stochastic``: the family replays log-
probabilities and needs a stochastic sampler.

Adding a family is one module with its plan and loss and one :func:`register_family`
call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from rlpost.core.registry import ParamsRegistry


@dataclass(frozen=True)
class LossInput:
    """One micro-batch of a method's loss (``B`` samples; image dims ``...``).

    * ``v`` ``[B, ...]``: the current velocity at the evaluated points (differentiable);
    * ``advantages`` ``[B]``: the method's advantage (RWR: non-negative weights);
    * ``logprob`` / ``old_logprob`` ``[B]``: SDE methods, the stored transition's
      log-probability under the current (differentiable) and the sampling policy;
    * ``target`` ``[B, ...]``: ODE methods, the conditional flow-matching target
      ``u = eps - x0`` of the re-noised endpoint;
    * ``v_ref`` / ``v_old`` ``[B, ...]``: when the method declares them
      (``Input.REF_VELOCITY`` / ``Input.SAMPLING_VELOCITY``).
    """

    v: Tensor
    advantages: Tensor
    logprob: Tensor | None = None
    old_logprob: Tensor | None = None
    target: Tensor | None = None
    v_ref: Tensor | None = None
    v_old: Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # [B] per-sample loss (to be minimised)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Plan:
    order: Tensor  # [N] the positions to train, permuted
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    name: str
    plan: Callable[[Any, Any, Any], Plan]
    loss: Callable[[Any, Any, Plan, Tensor], tuple[Tensor, dict[str, float]]]
    params: type
    stochastic: bool


class FamilyRegistry(ParamsRegistry[Family]):
    def __init__(self) -> None:
        super().__init__("diffusion training family")


FAMILIES = FamilyRegistry()


def register_family(family: Family) -> Family:
    return FAMILIES.register(family)


def regularize(
    tr: Any, loss: Tensor, inp: Any, sums: dict[str, float], scale: float = 1.0
) -> Tensor:
    """``loss`` plus every active regulariser's ``coef * penalty`` (in the run's order),
    each penalty's batch mean added to ``sums`` under its name (times ``scale``)."""
    for reg, p in tr.regularizers:
        pen = reg.penalty(inp, p)
        loss = loss + p.coef * pen
        sums[reg.name] = sums.get(reg.name, 0.0) + pen.mean().item() * scale
    return loss
