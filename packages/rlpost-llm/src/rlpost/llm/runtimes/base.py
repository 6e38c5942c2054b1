"""Runtimes: how a run is driven, one registered entry each.

``rlpost-llm train`` runs the runtime its config selects (:func:`runtime_for`): a CoPD,
federated or Mutual RL section picks that runtime (they are exclusive, checked when the
config loads), otherwise the GRPO-family trainer runs. The preference and DLR trainers
have configs of their own and commands of their own (``rlpost-llm dpo`` / ``dlr``), and
are looked up here by name the same way.

An entry names its implementation as ``"module:function"``, imported when it runs:
``run(cfg, *, resume, overwrite) -> str`` (the report the command prints) and, for a
runtime with a config of its own, ``load(path, overrides) -> config``. So registering a
runtime imports nothing heavy, and the config never depends on a runtime's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.core.io.config import import_object
from rlpost.core.registry import NamedRegistry


@dataclass(frozen=True)
class Runtime:
    """One way to drive a run (see the module docstring)."""

    name: str
    target: str  # "module:function": run(cfg, *, resume, overwrite) -> report
    selects: Callable[[Any], bool] | None = None  # a train config that picks it
    loader: str | None = None  # "module:function" loading its own config

    def run(self, cfg: Any, *, resume: bool = False, overwrite: bool = False) -> str:
        fn = import_object(self.target, f"runtime {self.name!r}")
        return fn(cfg, resume=resume, overwrite=overwrite)

    def load(self, path: str | Path | None, overrides: list[str]) -> Any:
        """This runtime's config: defaults <- recipe <- overrides, validated."""
        if self.loader is None:
            from rlpost.llm.config import load_config

            return load_config(path, overrides)
        return import_object(self.loader, f"runtime {self.name!r}")(path, overrides)


RUNTIMES: NamedRegistry[Runtime] = NamedRegistry("runtime")
DEFAULT = "grpo"

for _rt in (
    Runtime(DEFAULT, "rlpost.llm.runtimes.grpo:run"),
    Runtime("copd", "rlpost.llm.runtimes.copd:run", selects=lambda cfg: cfg.copd is not None),
    Runtime(
        "federated",
        "rlpost.llm.runtimes.federated:run",
        selects=lambda cfg: cfg.federated is not None,
    ),
    Runtime(
        "mutual",  # (a member's own config, mutual.member set, runs as a plain trainer)
        "rlpost.llm.runtimes.mutual:run",
        selects=lambda cfg: cfg.mutual is not None and cfg.mutual.member is None,
    ),
    Runtime(
        "preference",
        "rlpost.llm.preference.trainer:run",
        loader="rlpost.llm.preference.config:load_preference_config",
    ),
    Runtime("dlr", "rlpost.llm.runtimes.dlr:run", loader="rlpost.llm.runtimes.dlr:load_dlr_config"),
):
    RUNTIMES.register(_rt)


def runtime_for(cfg: Any) -> Runtime:
    """The runtime a train config selects (the GRPO-family trainer unless a section picks
    another)."""
    for name in RUNTIMES:
        rt = RUNTIMES.get(name)
        if rt.selects is not None and rt.selects(cfg):
            return rt
    return RUNTIMES.get(DEFAULT)


__all__ = ["RUNTIMES", "Runtime", "runtime_for"]
