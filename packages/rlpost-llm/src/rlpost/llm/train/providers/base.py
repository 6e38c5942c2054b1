"""Input providers: one registered component per contract input the trainer can supply.

A provider declares the :class:`~rlpost.core.contract.Input` s it ``provides``, whether
a config lets it (``available``; ``hint``: what to set when it does not) and whether a
run needs it (``wanted``: by default, when the step reads one of its inputs). The inputs
the trainer provides are derived from this registry (:func:`provided_inputs`), so the
contract check at config load cannot drift from the code, and a step computes only what
its recipe, token weighting and regulariser read.

A new provider is one module: a :class:`InputProvider` subclass with
``@INPUT_PROVIDERS.register``; its inputs then reach every entry that declares them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rlpost.core.contract import Input
from rlpost.core.regularizers import REGULARIZERS
from rlpost.core.weights import TOKEN_WEIGHTINGS
from rlpost.llm.train.components import ComponentRegistry, StepComponent


class InputProvider(StepComponent):
    """A step component that computes contract inputs (see the module docstring)."""

    provides: ClassVar[frozenset[Input]] = frozenset()
    hint: ClassVar[str | None] = None  # how to make the trainer provide them

    @classmethod
    def available(cls, cfg: Any) -> bool:
        """Whether the trainer can provide these inputs under ``cfg``."""
        return True

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        """Whether a run of ``cfg`` needs this provider (``reads``: every input its recipe,
        token weighting and regulariser read)."""
        return bool(cls.provides & reads)


INPUT_PROVIDERS = ComponentRegistry("input provider")


def provided_inputs(cfg: Any) -> frozenset[Input]:
    """What the trainer provides under ``cfg``: every available provider's inputs."""
    return frozenset(i for p in INPUT_PROVIDERS.values() if p.available(cfg) for i in p.provides)


def hints() -> dict[Input, str]:
    """How to make the trainer provide an input it does not under a config."""
    return {i: p.hint for p in INPUT_PROVIDERS.values() if p.hint for i in p.provides}


def step_reads(cfg: Any, recipe: Any) -> frozenset[Input]:
    """Every input a run of ``cfg`` reads: its recipe's, its token weighting's and its
    regulariser's (needed or optional)."""
    out = set(recipe.reads())
    for reg, c in ((TOKEN_WEIGHTINGS, cfg.algo.token_weights), (REGULARIZERS, cfg.regularizer)):
        if c is not None:
            out |= reg.build(c.name, **dict(c.params)).reads
    return frozenset(out)


def active(trainer: Any) -> list[StepComponent]:
    """The providers a trainer's run needs, built."""
    cfg, recipe, reads = trainer.cfg, trainer.recipe, trainer.reads
    return [p(trainer) for p in INPUT_PROVIDERS.values() if p.wanted(cfg, recipe, reads)]
