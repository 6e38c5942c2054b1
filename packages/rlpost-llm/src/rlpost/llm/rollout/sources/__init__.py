"""Rollout sources, one module each (see :mod:`.base`): ``groups`` (plain, the default
generator), ``episodes`` (``data.env``), ``feedback`` (FBOS-RL), ``pilot_commit``
(Pilot-Commit's budget allocation), ``lze`` (LZE's data selection), ``armor`` (ARMOR's
anchor rollouts), ``astor`` (ASTOR's multi-task schedule), ``episode_reflection`` (RubricEM's reflection
on judged episodes), ``dynamic_sampling``
(refill rounds), ``stages`` (Mu-GRPO), and the ``train.pipeline`` schedules ``sync``,
``one_step_off``, ``dora``, ``bubblespec`` and ``rolloutpipe``.

:func:`stack` is a run's sources innermost first; :func:`build` makes them for a trainer.
"""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Party
from rlpost.core.presets import Choice
from rlpost.core.registry import NoParams
from rlpost.llm.rollout.sources import (  # noqa: F401  (each module registers its source)
    armor,
    astor,
    bubblespec,
    dora,
    episodes,
    feedback,
    lze,
    pilot_commit,
    refill,
    reflect,
    rolloutpipe,
    stages,
    sync,
)
from rlpost.llm.rollout.sources.base import (
    GENERATE,
    ROLLOUT_SOURCES,
    Rollouts,
    RolloutSource,
    get_source,
    register_source,
    source_params,
    with_options,
)
from rlpost.llm.rollout.sources.groups import GroupsSource
from rlpost.llm.rollout.sources.sync import ASYNC_PIPELINE, SYNC_PIPELINE

DEFAULT_GENERATOR = GroupsSource


def stack(cfg: Any, preset: Any) -> list[tuple[type[RolloutSource], Any]]:
    """The run's sources and their params, innermost first: the generator its data picks
    (replaced by one its preset names), the preset's (``Preset.rollout``), then
    ``train.pipeline``."""
    picked = [c for c in ROLLOUT_SOURCES.values() if c.selected(cfg)]
    named = [(get_source(c.name), c.params) for c in preset.rollout]
    chosen = [(c, source_params(c, p)) for c, p in named]
    base = picked[0] if picked else DEFAULT_GENERATOR
    if not any(c.layer == GENERATE for c, _ in chosen):
        chosen.insert(0, (base, NoParams()))
    chosen.append((get_source(cfg.train.pipeline), NoParams()))
    return sorted(chosen, key=lambda cp: cp[0].layer)


def build(trainer: Any) -> RolloutSource:
    """The trainer's sources, outermost returned."""
    src = None
    for cls, params in stack(trainer.cfg, trainer.preset):
        src = cls(trainer, src, params)
    return src


def parties(cfg: Any, preset: Any, recipe: Any) -> list[Party]:
    """Every source the config switches on (a data-picked generator too, when the preset
    replaces it: its declarations still hold)."""
    seen = stack(cfg, preset)
    picked = [(c, NoParams()) for c in ROLLOUT_SOURCES.values() if c.selected(cfg)]
    out = []
    for cls, params in [*picked, *seen]:
        if cls is not DEFAULT_GENERATOR and not any(
            p.name == cls.party(preset, params).name for p in out
        ):
            out.append(cls.party(preset, params))
    return out


def validate(preset: Any) -> None:
    """The preset's rollout sources exist, their params are valid and fit the preset."""
    for c in preset.rollout:
        cls = get_source(c.name)
        cls.check_preset(preset, source_params(cls, c.params))


def check(cfg: Any, preset: Any) -> None:
    """Each source's own checks of the config."""
    for cls, params in stack(cfg, preset):
        cls.check(cfg, preset, params)


def rows_per_group(cfg: Any, preset: Any) -> int:
    """The most rows one prompt's group puts in a step."""
    n = preset.group_size
    for cls, params in stack(cfg, preset):
        n = max(n, cls.rows_per_group(params, preset.group_size))
    return n


def apply_options(algo: Any, rollout: tuple[Choice, ...]) -> tuple[Choice, ...]:
    """``Preset.rollout`` after the ``algo.<option>`` keys sources answer to
    (``algo.dynamic_sampling``, ``algo.stages``, ``algo.feedback``)."""
    return with_options(algo, rollout, ROLLOUT_SOURCES.values())


def preset_params(preset: Any, name: str) -> Any:
    """The validated params of source ``name`` in ``preset``'s rollout (None: absent)."""
    for c in preset.rollout:
        if c.name == name:
            return source_params(get_source(name), c.params)
    return None


__all__ = [
    "ASYNC_PIPELINE",
    "ROLLOUT_SOURCES",
    "SYNC_PIPELINE",
    "RolloutSource",
    "Rollouts",
    "apply_options",
    "build",
    "check",
    "get_source",
    "preset_params",
    "register_source",
    "rows_per_group",
    "stack",
    "validate",
]
