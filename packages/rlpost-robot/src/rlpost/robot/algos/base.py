"""The algorithm registry of the robot trainer: ``ALGORITHMS``.

An :class:`Algorithm` names what the trainer needs to run it, so that the trainer holds no
algorithm names:

* ``config``: its frozen dataclass of hyper-parameters (``algo.params`` in a recipe, with
  ``seed`` from ``run.seed``), validated at load like a core registry's parameters;
* ``policy_kind``: the :data:`rlpost.robot.policies.kinds.POLICY_KINDS` entry it fine-tunes;
* ``run``: ``run(ctx) -> {"history": [...], "config": {...}}`` with ``ctx`` the typed
  :class:`RunContext` (policy, task, demonstrations, config, logger, progress,
  checkpoints), the algorithm's fine-tuning, usually its learner plugged into
  :func:`rlpost.robot.algos.common.online_loop` (which saves and resumes the
  ``ctx.checkpoints``, a :class:`~rlpost.robot.algos.common.Checkpoints` or None, through
  the learner's ``export_state`` / ``import_state``);
* ``check``: an optional ``check(task, config)`` run at config load (e.g. CRAFT needs a
  counterfactual model of the task);
* ``fleet``: optionally, its learner as ``rlpost-robot fleet`` runs it: a class built as
  ``cls(policy, demos, config)`` implementing
  :class:`~rlpost.robot.algos.common.ReplayLearner` (warm-up, add episodes, train,
  state). The fleet's robots act with a flow chunk policy and the config's
  ``sample_steps``, so a fleet algorithm fine-tunes a ``flow`` policy.

An algorithm's config dataclass and its registration live in a light module,
``configuration_<name>.py`` (``run`` and ``check`` named as ``"module:function"``), so
that validating a recipe imports no torch; its learner and runner in ``<name>.py``.
Adding an algorithm is those two modules, one import line in ``algos/__init__.py`` and a
recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpost.core.registry import NamedRegistry, make_params


@dataclass(frozen=True)
class RunContext:
    """Everything an algorithm's run receives: the policy to fine-tune in place, the task,
    the demonstrations (the BC policy's; an algorithm may not read them), its validated
    config, a logger of per-round rows (None: not logged), whether to show progress, and
    the checkpoints (:class:`~rlpost.robot.algos.common.Checkpoints`; None: none written,
    nothing resumed)."""

    policy: Any
    task: str
    demos: Sequence[Any]
    config: Any
    log: Callable[[dict[str, Any]], None] | None = None
    progress: bool = True
    checkpoints: Any = None


@dataclass(frozen=True)
class Algorithm:
    name: str
    title: str  # for tables: "OTQL", "PAC-ACT", ...
    paper: str
    config: type
    policy_kind: str
    run: Callable[[RunContext], dict[str, Any]] | str  # or "module:function", imported to run
    check: Callable[[str, Any], None] | str | None = None
    fleet: type | str | None = None  # its ReplayLearner class, or "module:Class"

    episodes_field: str = "episodes"  # the config field holding the online budget

    def runner(self) -> Callable[[RunContext], dict[str, Any]]:
        return _resolve(self.run)

    def checker(self) -> Callable[[str, Any], None] | None:
        return None if self.check is None else _resolve(self.check)

    def fleet_learner(self) -> type:
        if self.fleet is None:
            raise ValueError(f"the fleet does not run {self.name}")
        return _resolve(self.fleet)


def _resolve(fn: Any) -> Any:
    """A callable, or the ``"module:function"`` it names (imported now)."""
    if not isinstance(fn, str):
        return fn
    import importlib

    module, _, name = fn.partition(":")
    return getattr(importlib.import_module(module), name)


class AlgorithmRegistry(NamedRegistry[Algorithm]):
    def __init__(self) -> None:
        super().__init__("robot algorithm")

    def config(self, name: str, params: Mapping[str, Any], seed: int) -> Any:
        """The algorithm's validated config (errors name the field)."""
        a = self.get(name)
        return make_params(a.config, f"algorithm {name!r}", {**dict(params), "seed": seed})


ALGORITHMS = AlgorithmRegistry()


def check_ranges(
    cfg: Any,
    *,
    nonneg: tuple[str, ...] = (),
    positive: tuple[str, ...] = (),
    counts: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
) -> None:
    """Range checks for an algorithm config's ``__post_init__``: ``nonneg`` fields >= 0,
    ``positive`` > 0, ``counts`` integers >= 1, ``unit`` in [0, 1]; the error names the field."""
    for name in nonneg:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    for name in positive:
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{name} must be > 0, got {getattr(cfg, name)}")
    for name in counts:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in unit:
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {getattr(cfg, name)}")


def register_algorithm(algo: Algorithm) -> Algorithm:
    """Register ``algo`` in :data:`ALGORITHMS` (see the module docstring)."""
    return ALGORITHMS.register(algo)
