"""The method registry of the diffusion trainer: ``METHODS``.

A :class:`Method` names everything that makes a post-training method of a flow-matching
generator, so that the trainer holds no method names:

* ``sampler``: how training rollouts are drawn (``ode``: the deterministic ODE, then the
  clean endpoints are re-noised as in pretraining; ``flow_grpo`` / ``dance``: an SDE whose
  per-step Gaussian transitions are stored with their log-probabilities and replayed);
* ``advantage``: a :data:`rlpost.core.advantages.ADVANTAGES` entry and its parameters
  (per prompt group or per batch), computed from the rewards of each step's samples;
* ``loss``: ``fn(LossInput, params) -> LossOutput``, per sample ``[B]``, with ``params``
  the method's own frozen dataclass (validated at config load, errors name the field);
* ``needs``: what the loss reads beyond the current velocity and the advantages (the
  reference's velocity, the sampling model's velocity), so the trainer evaluates them only
  for methods that declare them;
* the defaults of the knobs the trainer applies around any loss: the KL coefficient
  (``kl_term=False`` for methods whose loss already contains it), the fraction of
  denoising steps trained, shared initial noise per prompt group.

Adding a method is one module with its loss and one :func:`register_method` call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from torch import Tensor

from rlpost.core.advantages import ADVANTAGES
from rlpost.core.presets import Choice
from rlpost.core.registry import Bound, NamedRegistry, NoParams, make_params

SamplerKind = Literal["ode", "flow_grpo", "dance"]


class Needs(StrEnum):
    """What a method's loss reads beyond ``v`` and the advantages."""

    REFERENCE = "reference"  # v_ref: the frozen reference's velocity at the same inputs
    SAMPLING = "sampling"  # v_old: the sampling model's velocity (before this step's updates)


@dataclass(frozen=True)
class LossInput:
    """One micro-batch of a method's loss (``B`` samples; image dims ``...``).

    * ``v`` ``[B, ...]``: the current velocity at the evaluated points (differentiable);
    * ``advantages`` ``[B]``: the method's advantage (RWR: non-negative weights);
    * ``logprob`` / ``old_logprob`` ``[B]``: SDE methods, the stored transition's
      log-probability under the current (differentiable) and the sampling policy;
    * ``target`` ``[B, ...]``: ODE methods, the conditional flow-matching target
      ``u = eps - x0`` of the re-noised endpoint;
    * ``v_ref`` / ``v_old`` ``[B, ...]``: when the method declares them (:class:`Needs`).
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


@dataclass(frozen=True)
class Method:
    name: str
    paper: str
    sampler: SamplerKind
    advantage: Choice
    loss: Callable[[LossInput, Any], LossOutput]
    params: type = NoParams
    needs: frozenset[Needs] = frozenset()
    kl_coef: float = 0.0  # default weight of the trainer's KL term
    kl_term: bool = True  # False: the loss already holds the KL (RAM's target)
    timestep_fraction: float = 1.0  # SDE methods: fraction of denoising steps trained
    shared_noise: bool = False  # one initial noise per prompt group

    @property
    def sde(self) -> bool:
        """Whether training replays stored SDE transitions (else re-noised endpoints)."""
        return self.sampler != "ode"


@dataclass(frozen=True)
class BoundMethod:
    """A method with validated parameters and its bound advantage estimator."""

    method: Method
    params: Any
    advantage: Bound

    @property
    def name(self) -> str:
        return self.method.name

    def loss(self, inp: LossInput) -> LossOutput:
        return self.method.loss(inp, self.params)


class MethodRegistry(NamedRegistry[Method]):
    """``name -> Method``; registering a name twice raises, an unknown name lists the
    valid ones, parameters are validated like a core registry's."""

    def __init__(self) -> None:
        super().__init__("diffusion method")

    def register(self, method: Method) -> Method:
        if not dataclasses.is_dataclass(method.params):
            raise TypeError(f"method {method.name!r}: params must be a frozen dataclass")
        ADVANTAGES.build(method.advantage.name, **dict(method.advantage.params))
        return super().register(method)

    def build(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        advantage: Choice | None = None,
    ) -> BoundMethod:
        """``name`` with ``params`` (validated) and its advantage; ``advantage`` replaces
        the method's (``name=None``-style overrides are resolved by the caller)."""
        m = self.get(name)
        p = make_params(m.params, f"method {name!r}", dict(params or {}))
        adv = advantage or m.advantage
        return BoundMethod(m, p, ADVANTAGES.build(adv.name, **dict(adv.params)))

    def table(self) -> str:
        """One line per method: sampler, advantage, what the loss reads, KL default, paper."""
        lines = [f"{'method':<12}{'sampler':<11}{'advantage':<17}{'reads':<20}{'kl':>6}  paper"]
        for m in map(self.get, self.names()):
            reads = ",".join(sorted(m.needs)) or "-"
            kl = f"{m.kl_coef:g}" if m.kl_term else "(loss)"
            lines.append(
                f"{m.name:<12}{m.sampler:<11}{m.advantage.name:<17}{reads:<20}{kl:>6}  {m.paper}"
            )
        return "\n".join(lines)


METHODS = MethodRegistry()


def register_method(method: Method) -> Method:
    """Register ``method`` in :data:`METHODS` (see the module docstring)."""
    return METHODS.register(method)
