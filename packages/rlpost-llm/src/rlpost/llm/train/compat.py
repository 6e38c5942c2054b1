"""Which of a run's components may run together, as the components declare it.

Every component a config can switch on (a rollout source, an engine, a parallel mode, a
step hook, an input provider, a data mode, a runtime, and each loss entry through its
coupling) declares in the core's vocabulary (:class:`rlpost.core.contract.Property`) what
it requires of a step and what it breaks. At config load :func:`check` gathers the
parties the config switches on and refuses a conflict naming both::

    train.pipeline rolloutpipe trains each complete group as it arrives; advantage
    estimator 'reinforce_pp' reads the whole step batch

Two kinds of registration feed it, and no list of pairs exists anywhere:

* :func:`register_switch`: a party a config value switches on (``model.lora``,
  ``data.path``, ``rollout.workers``), registered beside the config class it reads;
* :func:`register_parties`: a function listing the parties of a registry's selected
  entries (the rollout sources, step hooks and input providers register one each).

This module imports nothing of :mod:`rlpost.llm` but the core, so every config module can
register here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlpost.core.contract import Coupling, Declares, Input, Party, Property, check_compatible


@dataclass(frozen=True)
class Switch:
    """A party present when ``on(cfg)`` holds; ``example``: overrides that switch it on."""

    name: str
    on: Callable[[Any], bool]
    declares: Declares
    example: tuple[str, ...] = ()


SWITCHES: list[Switch] = []
_GATHERERS: list[Callable[[Any, Any, Any], Iterable[Party]]] = []
_CHECKS: list[Callable[[Any, Any, Any], None]] = []


def register_switch(
    name: str,
    on: Callable[[Any], bool],
    *,
    requires: Mapping[Property, str] | None = None,
    breaks: Mapping[Property, str] | None = None,
    example: Iterable[str] = (),
) -> Switch:
    """Declare the party ``name``, present in every config where ``on(cfg)`` holds."""
    if any(s.name == name for s in SWITCHES):
        raise ValueError(f"compatibility switch {name!r} is already registered")
    sw = Switch(name, on, Declares(dict(requires or {}), dict(breaks or {})), tuple(example))
    SWITCHES.append(sw)
    return sw


def register_parties(fn: Callable[[Any, Any, Any], Iterable[Party]]):
    """Register ``fn(cfg, preset, recipe) -> parties`` (a registry's selected entries)."""
    _GATHERERS.append(fn)
    return fn


def register_check(fn: Callable[[Any, Any, Any], None]):
    """Register ``fn(cfg, preset, recipe)``: a section's own check of the whole config
    (what it needs of other sections), raising a one-line ``ValueError``."""
    _CHECKS.append(fn)
    return fn


def run_checks(cfg: Any, preset: Any, recipe: Any) -> None:
    for fn in _CHECKS:
        fn(cfg, preset, recipe)


def coupling_parties(recipe: Any) -> list[Party]:
    """The recipe's entries as parties: what their coupling requires of a step."""
    out = []
    for e in recipe.loss_entries():
        if e.coupling >= Coupling.GROUP:
            req = {Property.WHOLE_GROUPS: "couples the rows of a group in the loss"}
            if e.coupling == Coupling.GROUP:
                req[Property.EVEN_GROUPS] = "couples the responses of a group (group_size each)"
            else:
                req[Property.WHOLE_BATCH] = "reads the whole step batch"
            out.append(Party(str(e), Declares(req)))
    if recipe.advantage.coupling == Coupling.BATCH:
        out.append(
            Party(
                str(recipe.advantage),
                Declares({Property.WHOLE_BATCH: "reads the whole step batch"}),
            )
        )
    by = recipe.reads().get(Input.DYNAMICS)
    if by:
        need = {Property.WHOLE_BATCH: "reads the batch's entropy (dynamics)"}
        out.append(Party(", ".join(by), Declares(need)))
    return out


def parties(cfg: Any, preset: Any, recipe: Any, extra: Iterable[Party] = ()) -> list[Party]:
    """Every party ``cfg`` switches on, in a stable order."""
    out = [Party(s.name, s.declares) for s in SWITCHES if s.on(cfg)]
    for gather in _GATHERERS:
        out += gather(cfg, preset, recipe)
    return [*out, *coupling_parties(recipe), *extra]


def check(cfg: Any, preset: Any, recipe: Any, extra: Iterable[Party] = ()) -> None:
    """Raise :class:`~rlpost.core.contract.ContractError` (a ``ValueError``) naming both
    parties of every conflict among what ``cfg`` switches on."""
    check_compatible(parties(cfg, preset, recipe, extra))


def data_parallel(world: int) -> Party:
    """The learner's ranks under ``torchrun`` (checked when the trainer starts)."""
    return Party(
        f"data-parallel training ({world} processes)",
        Declares(
            breaks={
                Property.WHOLE_GROUPS: "gives each rank strided rows",
                Property.ONE_PROCESS: "runs the learner in several processes",
            }
        ),
    )


__all__ = [
    "SWITCHES",
    "Switch",
    "check",
    "coupling_parties",
    "data_parallel",
    "parties",
    "register_check",
    "register_parties",
    "register_switch",
    "run_checks",
]
