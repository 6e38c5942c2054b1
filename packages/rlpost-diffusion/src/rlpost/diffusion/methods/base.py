"""The method registry of the diffusion trainer: ``METHODS``.

A :class:`Method` names everything that makes a post-training method of a flow-matching
generator, each a choice from a registry, so that the trainer holds no method names:

* ``sampler``: how rollouts are drawn, a :data:`rlpost.diffusion.samplers.SAMPLERS` entry
  and its parameters (``ode``; the SDEs ``flow_grpo`` and ``dance``, whose per-step
  Gaussian transitions carry log-probabilities);
* ``family``: how a batch becomes loss inputs, a :data:`rlpost.diffusion.families.FAMILIES`
  entry and its parameters (``sde_replay``: the stored SDE transitions replayed with
  ratios, on ``timestep_fraction`` of the steps; ``renoise``: the
  clean endpoints re-noised as in pretraining, velocity regression);
* ``advantage``: a :data:`rlpost.core.advantages.ADVANTAGES` entry and its parameters
  (per prompt group or per batch), computed from the rewards of each step's samples;
* ``loss``: ``fn(LossInput, params) -> LossOutput``, per sample ``[B]``, with ``params``
  the method's own frozen dataclass (validated at config load, errors name the field);
* ``needs``: what the loss reads beyond the current velocity and the advantages, in the
  core's :class:`~rlpost.core.contract.Input` vocabulary (``REF_VELOCITY``,
  ``SAMPLING_VELOCITY``), so the family evaluates them only for methods that declare them;
* ``regularizers``: :data:`rlpost.diffusion.regularizers.REGULARIZERS` entries added to
  the loss (the KL to the reference, NormGuard), the run's ``algo.kl_coef`` and
  ``algo.normguard`` overriding or adding them (``kl_term=False``: the loss already holds
  the KL, RAM's target); and shared initial noise per prompt group.

Adding a method is one module with its loss and one :func:`register_method` call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlpost.core.advantages import ADVANTAGES
from rlpost.core.contract import Input
from rlpost.core.presets import Choice
from rlpost.core.registry import Bound, NoParams, ParamsRegistry
from rlpost.diffusion.families import FAMILIES
from rlpost.diffusion.families.base import LossInput, LossOutput
from rlpost.diffusion.regularizers import REGULARIZERS
from rlpost.diffusion.samplers import SAMPLERS

__all__ = ["METHODS", "NEEDS", "BoundMethod", "LossInput", "LossOutput", "Method",
           "register_method"]  # fmt: skip

# what a method's loss may read beyond ``v`` and the advantages
NEEDS = frozenset({Input.REF_VELOCITY, Input.SAMPLING_VELOCITY})


@dataclass(frozen=True)
class Method:
    name: str
    paper: str
    sampler: Choice  # a SAMPLERS entry and its parameters
    family: Choice  # a FAMILIES entry and its parameters
    advantage: Choice
    loss: Callable[[LossInput, Any], LossOutput]
    params: type = NoParams
    needs: frozenset[Input] = frozenset()
    regularizers: tuple[Choice, ...] = ()  # REGULARIZERS entries (e.g. kl, its coef)
    kl_term: bool = True  # False: the loss already holds the KL (RAM's target)
    shared_noise: bool = False  # one initial noise per prompt group

    @property
    def kl_coef(self) -> float:
        """The default weight of the KL regulariser (0: none listed)."""
        return float(next((r.params.get("coef", 0.0) for r in self.regularizers
                           if r.name == "kl"), 0.0))  # fmt: skip


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


class MethodRegistry(ParamsRegistry[Method]):
    """``name -> Method``; registering a name twice raises, an unknown name lists the
    valid ones, parameters are validated like a core registry's."""

    def __init__(self) -> None:
        super().__init__("diffusion method")

    def register(self, method: Method) -> Method:
        ADVANTAGES.build(method.advantage.name, **dict(method.advantage.params))
        SAMPLERS.params(method.sampler.name, method.sampler.params)
        family = FAMILIES.get(method.family.name)
        FAMILIES.params(family.name, method.family.params)
        if family.stochastic != SAMPLERS.get(method.sampler.name).stochastic:
            kind = "a stochastic" if family.stochastic else "a deterministic"
            raise TypeError(f"method {method.name!r}: family {family.name!r} needs {kind} "
                            f"sampler, not {method.sampler.name!r}")  # fmt: skip
        for r in method.regularizers:
            REGULARIZERS.params(r.name, r.params)
        if not method.needs <= NEEDS:
            raise TypeError(f"method {method.name!r}: needs {sorted(method.needs - NEEDS)} "
                            f"is not among what a loss may read, {sorted(NEEDS)}")  # fmt: skip
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
        p = self.params(name, params or {})
        adv = advantage or m.advantage
        return BoundMethod(m, p, ADVANTAGES.build(adv.name, **dict(adv.params)))

    def table(self) -> str:
        """One line per method: sampler, family, advantage, what the loss reads, KL default,
        paper."""
        head = f"{'method':<12}{'sampler':<11}{'family':<12}{'advantage':<17}{'reads':<32}"
        lines = [f"{head}{'kl':>6}  paper"]
        for m in map(self.get, self.names()):
            reads = ",".join(sorted(m.needs)) or "-"
            kl = f"{m.kl_coef:g}" if m.kl_term else "(loss)"
            lines.append(f"{m.name:<12}{m.sampler.name:<11}{m.family.name:<12}{m.advantage.name:<17}"
                         f"{reads:<32}{kl:>6}  {m.paper}")  # fmt: skip
        return "\n".join(lines)


METHODS = MethodRegistry()


def register_method(method: Method) -> Method:
    """Register ``method`` in :data:`METHODS` (see the module docstring)."""
    return METHODS.register(method)
