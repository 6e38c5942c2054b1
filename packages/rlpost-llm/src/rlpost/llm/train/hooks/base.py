"""Step hooks: behaviour around the update, one registered component each.

A hook is switched on by its config section or named by the preset (``Preset.hooks``:
REVA-PO's ``validation_reset``), runs at the step's phases
(:mod:`rlpost.llm.train.components`), keeps its own state for exact resume, and declares
what it requires of a step and what it breaks. A new hook is one module: a
:class:`StepHook` subclass with ``@STEP_HOOKS.register``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rlpost.core.presets import Choice
from rlpost.llm.rollout.sources.base import with_options
from rlpost.llm.train.components import ComponentRegistry, StepComponent


class StepHook(StepComponent):
    """A step component acting around the update (see the module docstring)."""

    option: ClassVar[str | None] = None  # the ``algo.<option>`` key that switches it

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        """Whether a run of ``cfg`` with ``preset`` uses this hook (default: the preset
        names it)."""
        return any(c.name == cls.name for c in preset.hooks)

    @classmethod
    def from_option(cls, value: Any, current: Choice | None) -> Choice | None:
        """The preset's choice of this hook after ``algo.<option>: value``."""
        return Choice(cls.name) if value else None


class SettingsHook(StepHook):
    """A hook switched on by ``algo.<setting>`` (a mapping of its ``settings`` dataclass's
    fields, ``{}``: the defaults; ``None`` or ``False``: off), its params validated at
    config load and kept as ``self.params``."""

    setting: ClassVar[str]
    settings: ClassVar[type]

    @classmethod
    def params_for(cls, cfg: Any) -> Any:
        from rlpost.core.registry import make_params

        value = getattr(cfg.algo, cls.setting)
        kw = dict(value) if isinstance(value, dict) else {}
        return make_params(cls.settings, f"algo.{cls.setting}", kw)

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return getattr(cfg.algo, cls.setting) not in (None, False)

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        cls.params_for(cfg)

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.params = self.params_for(trainer.cfg)


STEP_HOOKS = ComponentRegistry("step hook")


def apply_options(algo: Any, hooks: tuple[Choice, ...]) -> tuple[Choice, ...]:
    """``Preset.hooks`` after the ``algo.<option>`` keys hooks answer to
    (``algo.validation_reset``)."""
    return with_options(algo, hooks, STEP_HOOKS.values())


def active(trainer: Any) -> list[StepComponent]:
    """The hooks a trainer's run uses, built."""
    return [h(trainer) for h in STEP_HOOKS.values() if h.on(trainer.cfg, trainer.preset)]
