"""The parts of a trainer step: input providers and step hooks, one registered class each.

A step runs these phases, each a no-op unless a component overrides it::

    collected(col) -> col          the step's rollouts arrived (Mutual RL adds its peers')
    provide(step)                  fill the step's inputs (providers, by ``order``)
    advantaged(step, out)          the advantages exist (the critic keeps its targets)
    begin_update(col)              before anything trains (MIPU snapshots the weights)
    for each epoch:
        begin_epoch(step, epoch, acc)      (auxiliary gradients)
        for each micro-batch:
            micro_batch(mb, acc)           (the critic's value loss)
            forward_kwargs(mb) / from_forward(mb, out)   the training forward's extras
            extra_loss(mb, logp, acc)      (the compressed-KV distillation term)
            before_backward(mb) / after_backward(mb, acc)
        end_epoch(acc)                     (the critic's optimiser step)
        before_step(acc, epoch)            (a gradient regulariser)
    end_update(step, metrics)      (MIPU's acceptance, the critic's explained variance)
    evaluated(metrics)             (REVA-PO's validation reset)

and ``state_dict`` / ``load_state_dict`` for exact resume (under the checkpoint key
``state_key``). A component also declares what it requires of a step and what it breaks
(:class:`rlpost.core.contract.Declares`), checked at config load with everything else the
config switches on (:mod:`rlpost.llm.train.compat`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from rlpost.core.contract import Declares, Party
from rlpost.core.registry import NamedRegistry
from rlpost.llm.rollout.sources.base import back_reference


@dataclass
class MicroBatch:
    """One micro-batch of a step: ``idx`` its rows of the step's batch, ``sub`` those rows'
    rollouts, ``weight`` 0 for a rank without rows (it only joins the collective)."""

    step: Any  # StepInputs
    idx: Tensor
    sub: Any  # RolloutBatch
    weight: float
    last: bool
    count: int  # micro-batches in the epoch


class StepComponent:
    """Base of input providers and step hooks (see the module docstring)."""

    name: ClassVar[str]
    label: ClassVar[str] = ""  # how errors name it (default: its name)
    order: ClassVar[int] = 50  # phase order among components
    declares: ClassVar[Declares] = Declares()
    state_key: ClassVar[str | None] = None  # its checkpoint state's key (None: stateless)
    example: ClassVar[tuple[str, ...]] = ()  # config overrides that switch it on (tests)

    def __init__(self, trainer: Any):
        self.trainer = back_reference(trainer)

    @classmethod
    def party(cls) -> Party:
        return Party(cls.label or cls.name, cls.declares)

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        """Refuse, at config load, a config this component cannot run (one line)."""

    # ------------------------------------------------------------------ phases
    def collected(self, col: Any) -> Any:
        return col

    def provide(self, step: Any) -> None: ...

    def advantaged(self, step: Any, out: Any) -> None: ...

    def begin_update(self, col: Any) -> None: ...

    def trains_policy(self) -> bool:
        return True

    def begin_epoch(self, step: Any, epoch: int, acc: Any) -> None: ...

    def micro_batch(self, mb: MicroBatch, acc: Any) -> None: ...

    def forward_kwargs(self, mb: MicroBatch) -> dict[str, Any]:
        return {}

    def from_forward(self, mb: MicroBatch, out: tuple) -> dict[Any, Any]:
        return {}

    def extra_loss(self, mb: MicroBatch, logp: Tensor, acc: Any) -> Tensor | None:
        return None

    def before_backward(self, mb: MicroBatch) -> None: ...

    def after_backward(self, mb: MicroBatch, acc: Any) -> None: ...

    def end_epoch(self, acc: Any) -> None: ...

    def before_step(self, acc: Any, epoch: int) -> None: ...

    def end_update(self, step: Any, metrics: dict[str, float]) -> None: ...

    def evaluated(self, metrics: dict[str, float]) -> None: ...

    # ------------------------------------------------------------------ state
    def state_dict(self) -> tuple[Any, dict[str, Tensor]]:
        """``(JSON-able state, tensors)`` for the checkpoint."""
        return None, {}

    def load_state_dict(self, state: Any, tensors: dict[str, Tensor]) -> None: ...

    def checkpoint_extras(self) -> dict[str, tuple[Any, Any]]:
        """Modules (and their optimisers) saved beside the policy (the critic)."""
        return {}

    def close(self) -> None: ...


class Components:
    """The step's active components in phase order, and the phases over all of them."""

    def __init__(self, items: list[StepComponent]):
        self.items = sorted(items, key=lambda c: c.order)

    def __iter__(self) -> Iterator[StepComponent]:
        return iter(self.items)

    def get(self, name: str) -> StepComponent | None:
        return next((c for c in self.items if c.name == name), None)

    def collected(self, col: Any) -> Any:
        for c in self.items:
            col = c.collected(col)
        return col

    def trains_policy(self) -> bool:
        return all(c.trains_policy() for c in self.items)

    def forward_kwargs(self, mb: MicroBatch) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.items:
            out.update(c.forward_kwargs(mb))
        return out

    def from_forward(self, mb: MicroBatch, res: tuple) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for c in self.items:
            out.update(c.from_forward(mb, res))
        return out

    def extra_loss(self, mb: MicroBatch, logp: Tensor, acc: Any) -> Tensor | None:
        total = None
        for c in self.items:
            term = c.extra_loss(mb, logp, acc)
            if term is not None:
                total = term if total is None else total + term
        return total

    def run(self, phase: str, *args: Any) -> None:
        """Call ``phase(*args)`` on every component (the phases that return nothing)."""
        for c in self.items:
            getattr(c, phase)(*args)

    def checkpoint_extras(self) -> dict[str, tuple[Any, Any]]:
        out: dict[str, tuple[Any, Any]] = {}
        for c in self.items:
            out.update(c.checkpoint_extras())
        return out


class ComponentRegistry(NamedRegistry):
    """``name -> component class`` for one kind (input providers, step hooks)."""

    def values(self) -> list[type[StepComponent]]:
        return list(self._items.values())
