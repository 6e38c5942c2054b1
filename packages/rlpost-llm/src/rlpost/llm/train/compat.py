"""Which of a run's components may run together, as the components declare it.

Every component a config can switch on (a rollout source, an engine, a parallel mode, a
step hook, an input provider, a data mode, a runtime, and each loss entry through its
coupling) declares in the core's vocabulary (:class:`rlpost.core.contract.Property`) what
it requires of a step and what it breaks. At config load :func:`check` gathers the
parties the config switches on and refuses a conflict naming both::

    train.pipeline rolloutpipe trains each complete group as it arrives; advantage
    estimator 'reinforce_pp' reads the whole step batch

Declarations live beside what they declare, and no list of pairs exists anywhere:

* a config section's module lists the parties its values switch on (``SWITCHES``:
  :class:`~rlpost.core.contract.Switch` es such as ``model.lora``, ``data.path``,
  ``rollout.workers``) and may list parties it chooses by value (``parties()``: the
  engine, the parallel mode) and its own checks of the whole config (``CHECKS``);
* each registry package lists the parties of its selected entries (the rollout sources,
  step hooks and input providers: ``parties()``, from each entry's ``declares``).

This module collects them (:data:`SECTIONS`, :data:`REGISTRIES`); nothing it imports
imports it back, so the arrows run one way: the config imports this, this imports the
sections and the registries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlpost.core.contract import (
    Coupling,
    Declares,
    Input,
    Party,
    Property,
    Switch,
    check_compatible,
)
from rlpost.llm.data import config as data_config
from rlpost.llm.methods import config as methods_config
from rlpost.llm.model import config as model_config
from rlpost.llm.rollout import config as rollout_config
from rlpost.llm.rollout import sources
from rlpost.llm.runtimes import config as runtimes_config
from rlpost.llm.train import config as train_config
from rlpost.llm.train import hooks, providers

# where declarations live: each config section module may define SWITCHES (parties its
# values switch on), CHECKS (its own checks of the whole config) and parties(cfg, preset,
# recipe); each registry package lists the parties of its selected entries
SECTIONS = (
    model_config,
    data_config,
    rollout_config,
    train_config,
    methods_config,
    runtimes_config,
)
REGISTRIES = (sources, hooks, providers)


def switches() -> list[Switch]:
    """Every registered switch of the config sections."""
    return [s for m in SECTIONS for s in getattr(m, "SWITCHES", ())]


def run_checks(cfg: Any, preset: Any, recipe: Any) -> None:
    """The sections' own checks of the whole config (what they need of other sections)."""
    for m in SECTIONS:
        for fn in getattr(m, "CHECKS", ()):
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
    out = [Party(s.name, s.declares) for s in switches() if s.on(cfg)]
    for m in (*SECTIONS, *REGISTRIES):
        if hasattr(m, "parties"):
            out += m.parties(cfg, preset, recipe)
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


__all__ = ["check", "coupling_parties", "data_parallel", "parties", "run_checks", "switches"]
