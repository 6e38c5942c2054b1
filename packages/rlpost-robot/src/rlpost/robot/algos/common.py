"""What every robot fine-tuning algorithm shares.

* :class:`ChunkBuffer` / :func:`chunk_transitions`: chunk-level transitions of episodes;
* :func:`evaluate_policy`, :func:`force_stats`: success, return and contact-force metrics;
* :func:`online_loop`: the one online fine-tuning loop. An algorithm supplies a learner
  (:class:`OnlineLearner`) with ``collect(n, seed)`` (run ``n`` episodes with the current
  policy, any data it needs), ``update(data)`` (learn from them; returns the round's
  metrics, including ``online_success``), ``export_state()`` (its whole state as a
  :class:`LearnerState`) and ``import_state(state, tensors)``; the loop spends the episode
  budget in rounds of ``envs`` episodes, logs one row per round, shows a progress bar and,
  given :class:`Checkpoints`, saves a checkpoint every ``every`` rounds (and after the
  last) and resumes exactly from one.

**Checkpoints** use the core format (:func:`rlpost.core.io.checkpoint.save_checkpoint`):
``<run.dir>/checkpoints/step-<episodes used>/`` holds the policy and its optimiser, every
other module of the learner with its optimiser (critics, target networks, an EMA teacher),
its replay buffers as tensors, its ``torch.Generator`` s, torch's global generator, and in
``state.json`` the learner's counters, the round, the episodes used and the history rows
so far. A resumed loop continues from the round after the checkpoint and ends with the
same parameters and rows as an uninterrupted one, bitwise (the environment episodes are
seeded by the episodes used; no robot code draws from numpy's or python's global RNG).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from rlpost.core.guard import RunStopped, training_loop

# ------------------------------------------------------------------ chunk transitions


@dataclass
class ChunkBuffer:
    """Chunk-level transitions ``(s_t, a_{t:t+H}, mask, R, s_{t+k}, discount)``.

    ``R = sum_{i<k} gamma^i r_{t+i}`` over the ``k = min(execute, T - t)`` executed steps and
    ``discount = gamma^k`` (0 when the episode terminated within the chunk), so that
    ``Q(s, a) = R + discount * V(s')``.
    """

    obs: Tensor
    chunks: Tensor
    mask: Tensor
    returns: Tensor
    next_obs: Tensor
    discount: Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        idx = torch.randint(len(self), (n,), generator=generator)
        return {k: getattr(self, k)[idx] for k in self.__dataclass_fields__}

    def extend(self, other: ChunkBuffer) -> ChunkBuffer:
        return ChunkBuffer(
            *(torch.cat([getattr(self, k), getattr(other, k)]) for k in self.__dataclass_fields__)
        )

    def state_tensors(self, prefix: str = "buffer") -> dict[str, Tensor]:
        """The buffer as named tensors ``<prefix>.<field>`` (for a checkpoint)."""
        return {f"{prefix}.{k}": getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], prefix: str = "buffer") -> ChunkBuffer:
        """The buffer :meth:`state_tensors` wrote."""
        missing = [k for k in cls.__dataclass_fields__ if f"{prefix}.{k}" not in tensors]
        if missing:
            raise KeyError(f"the checkpoint has no {prefix!r} buffer fields {missing}")
        return cls(**{k: tensors[f"{prefix}.{k}"] for k in cls.__dataclass_fields__})


def chunk_transitions(
    episodes: Sequence[Any], horizon: int, execute: int, gamma: float
) -> ChunkBuffer:
    """Every step ``t`` of every episode as a chunk transition (see :class:`ChunkBuffer`).

    Episodes need ``obs [T+1, D]``, ``actions [T, A]``, ``rewards [T]`` and a ``terminated``
    attribute (True when the last state is terminal, e.g. reached the goal; False when the
    episode was cut by the time limit, whose last state is bootstrapped).
    """
    cols: dict[str, list] = {k: [] for k in ChunkBuffer.__dataclass_fields__}
    for ep in episodes:
        obs, act, rew = (np.asarray(x, dtype=np.float32) for x in (ep.obs, ep.actions, ep.rewards))
        T = len(act)
        terminal = bool(getattr(ep, "terminated", False))
        for t in range(T):
            idx = np.minimum(np.arange(t, t + horizon), T - 1)
            k = min(execute, T - t)
            disc = gamma ** np.arange(k)
            cols["obs"].append(obs[t])
            cols["chunks"].append(act[idx])
            cols["mask"].append((np.arange(t, t + horizon) < T).astype(np.float32))
            cols["returns"].append(np.float32((disc * rew[t : t + k]).sum()))
            cols["next_obs"].append(obs[t + k])
            ends = t + k == T and terminal
            cols["discount"].append(np.float32(0.0 if ends else gamma**k))
    return ChunkBuffer(**{k: torch.as_tensor(np.stack(v)) for k, v in cols.items()})


# ----------------------------------------------------------------------- evaluation


def evaluate_policy(
    policy: Any,
    task: str,
    episodes: int,
    n_steps: int,
    seed: int,
    envs: int = 8,
    execute: int | None = None,
    progress: str | None = None,
) -> dict[str, float]:
    """Success rate (and return, force metrics) of ``policy`` with ``n_steps`` integration
    steps over ``episodes`` fresh episodes on vectorised envs. ``seed`` fixes the episodes'
    initial states and the policy's sampling noise (not torch's global generator, whose
    state depends on what ran before), so the same policy always scores the same.
    ``progress``: a bar with that title counts the episodes (None: no bar)."""
    from tqdm.auto import tqdm

    from rlpost.robot.demos import collect_episodes
    from rlpost.robot.policies.bc import ChunkController

    ctrl = ChunkController(
        policy, execute=execute or policy.cfg.horizon, n_steps=n_steps, seed=seed
    )
    with tqdm(total=episodes, desc=progress, disable=progress is None, leave=False) as bar:
        eps = collect_episodes(task, ctrl, n_episodes=episodes, seed=seed,
                               n_envs=min(envs, episodes), done=bar.update)  # fmt: skip
    return {
        "success": float(np.mean([e.success for e in eps])),
        "return": float(np.mean([e.metrics["return"] for e in eps])),
        **force_stats(eps),
    }


def collect_with(policy: Any, task: str, n: int, seed: int, n_steps: int) -> list[Any]:
    """``n`` episodes of ``task`` (seeded by ``seed``, ``n`` parallel envs) with a chunk
    policy sampling with ``n_steps`` integration steps, chunks executed open loop: an
    online learner's ``collect``. The policy is in eval mode while it acts."""
    from rlpost.robot.demos import collect_episodes
    from rlpost.robot.policies.bc import ChunkController

    ctrl = ChunkController(policy, execute=policy.cfg.horizon, n_steps=n_steps)
    policy.eval()
    eps = collect_episodes(task, ctrl, n_episodes=n, seed=seed, n_envs=n)
    policy.train()
    return eps


def force_stats(episodes: Sequence[Any]) -> dict[str, float]:
    """Mean per-episode peak contact force (N) and fraction of steps above the task's
    force threshold; empty for tasks without force."""
    peaks = [e.metrics.get("peak_force") for e in episodes]
    if not peaks or any(p is None for p in peaks):
        return {}
    return {
        "peak_force": float(np.mean(peaks)),
        "frac_force_above": float(np.mean([e.metrics["frac_force_above"] for e in episodes])),
    }


# ---------------------------------------------------------------------- online loop


@dataclass
class LearnerState:
    """Everything of a learner that its next round reads, for a checkpoint.

    ``model`` / ``optimizer``: the policy being fine-tuned and its optimiser;
    ``extras``: every other module, each with its optimiser or None (critics, target
    networks, a frozen prior, an EMA teacher); ``generators``: its ``torch.Generator`` s.
    These are the live objects: loading restores them in place. ``tensors``: other state
    tensors (replay / demonstration buffers); ``state``: JSON counters. These two are
    values, handed back to :meth:`OnlineLearner.import_state`.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    extras: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] = field(
        default_factory=dict
    )
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class OnlineLearner(Protocol):
    def collect(self, n: int, seed: int) -> Any:
        """Run ``n`` episodes (seeded by ``seed``) with the current policy."""

    def update(self, data: Any) -> dict[str, float]:
        """Learn from one round's data; the round's metrics (``online_success`` ...)."""

    def export_state(self) -> LearnerState:
        """The learner's whole state (see :class:`LearnerState`); anything it creates
        lazily must exist by now, so that loading into it restores everything."""

    def import_state(self, state: dict[str, Any], tensors: dict[str, Tensor]) -> None:
        """Take back the ``state`` and ``tensors`` of a :class:`LearnerState` (its modules,
        optimisers and generators were already restored in place)."""


class ReplayLearner(Protocol):
    """An algorithm's learner as the fleet runs it (:mod:`rlpost.robot.fleet.learner`):
    built as ``cls(policy, demos, config)`` (the registered ``Algorithm.fleet``), fed the
    episodes the fleet records, trained by version. Its replay is not checkpointed: a
    restarted fleet learner adds its accepted episodes back from the store."""

    policy: torch.nn.Module

    def warm_up(self) -> int:
        """The offline phase on the demonstrations (skipped when resuming); the number of
        updates it ran."""

    def add(self, episodes: Sequence[Any]) -> None:
        """Add recorded episodes to the online replay."""

    def train(self, updates: int) -> dict[str, float]:
        """``updates`` updates on replay batches; their mean metrics."""

    def online_size(self) -> int:
        """Online transitions in the replay."""

    def export_state(self) -> LearnerState:
        """As :meth:`OnlineLearner.export_state` (the fleet saves all but ``tensors``)."""

    def restore(self, state: dict[str, Any]) -> None:
        """Take back the ``state`` of a :class:`LearnerState` (modules, optimisers and
        generators were restored in place)."""


@dataclass
class Checkpoints:
    """Checkpointing of :func:`online_loop`: every ``every`` rounds (0: never) and after the
    last, into ``root`` (``<run.dir>/checkpoints``), keeping the newest ``keep``.

    ``resume``: the checkpoint folder to continue from (e.g.
    :func:`rlpost.core.io.rundir.resume_checkpoint`), None for a fresh start; ``state``:
    the caller's JSON state, stored in every checkpoint under ``"run"`` (read it back with
    :func:`checkpoint_state`); ``record``: called with each round's episodes (when the
    learner collects :class:`~rlpost.robot.demos.Episode` s), the round's index (the
    number of updates the collecting policy had) and the episodes used before them
    (``rlpost-robot train`` writes them to ``run.dir/experience``).
    """

    root: Path
    every: int = 1
    keep: int = 2
    resume: Path | None = None
    state: dict[str, Any] = field(default_factory=dict)
    record: Callable[[list[Any], int, int], None] | None = None

    @property
    def resuming(self) -> bool:
        """Whether the loop will restore :attr:`resume` (a runner skips its warm-up then:
        the checkpoint holds its result)."""
        return self.resume is not None


def checkpoint_state(path: Path) -> dict[str, Any]:
    """The ``state.json`` of checkpoint folder ``path``: ``step`` (the episodes used),
    ``run`` (the caller's state), ``loop`` (``round``, ``episodes``, ``history``),
    ``learner``."""
    return json.loads((Path(path) / "state.json").read_text())


def _save_round(
    learner: OnlineLearner, ck: Checkpoints, rounds: int, used: int, history: list
) -> None:
    from rlpost.core.io.checkpoint import save_checkpoint

    ls = learner.export_state()
    state = {
        "run": ck.state,
        "loop": {"round": rounds, "episodes": used, "history": history},
        "learner": ls.state,
    }
    save_checkpoint(
        ck.root, used, ls.model, ls.optimizer, None, state, keep=ck.keep,
        extras=ls.extras, tensors=ls.tensors, generators=ls.generators,
    )  # fmt: skip


def _restore_round(learner: OnlineLearner, path: Path) -> tuple[list, int, int]:
    """Load checkpoint ``path`` into ``learner`` (and torch's global generator); returns
    the history rows, the episodes used and the rounds done."""
    from rlpost.core.io.checkpoint import load_checkpoint, load_tensors

    ls = learner.export_state()
    state = load_checkpoint(
        path, ls.model, ls.optimizer, None, extras=ls.extras, generators=ls.generators
    )
    if "loop" not in state:
        raise ValueError(f"checkpoint {path} was not written by the robot online loop")
    learner.import_state(state.get("learner", {}), load_tensors(path))
    loop = state["loop"]
    return list(loop["history"]), int(loop["episodes"]), int(loop["round"])


MAX_ROUND_GROWTH = 1e3
"""A round whose update multiplies a module's weight norm by more than this has exploded
(finite but useless weights, e.g. a learning rate of 1e30): the loop stops before a
checkpoint keeps them."""


def _modules(learner: OnlineLearner) -> dict[str, torch.nn.Module]:
    export = getattr(learner, "export_state", None)
    if export is None:
        return {}
    ls = export()
    return {"policy": ls.model, **{k: m for k, (m, _) in ls.extras.items()}}


def _norms(learner: OnlineLearner) -> dict[str, float]:
    from rlpost.core.guard import global_norm

    return {k: global_norm(m.parameters()) for k, m in _modules(learner).items()}


def _diverged(learner: OnlineLearner, before: dict[str, float]) -> list[str]:
    """The learner's modules the round's update made non-finite or exploded."""
    bad = []
    for name, after in _norms(learner).items():
        if not math.isfinite(after):
            bad.append(f"{name} non-finite")
        elif after > MAX_ROUND_GROWTH * max(before.get(name, 0.0), 1e-12):
            bad.append(f"{name} exploded (norm x{after / max(before[name], 1e-12):.3g})")
    return bad


def _update(
    learner: OnlineLearner, data: Any, rounds: int, used: int, ck: Checkpoints | None
) -> tuple[dict[str, Any], RunStopped | None]:
    """``learner.update(data)``'s metrics, and the stop (:class:`RunStopped`, exit 3) to
    raise once the round is logged when the update left a module non-finite or exploded,
    before a checkpoint could keep it, also when the damage made the update itself fail (a
    sampler meeting NaN probabilities). (A rollback would not help: the next round would
    collect the same episodes and diverge again.) An error while the weights are sane is a
    bug and keeps its traceback."""
    before = _norms(learner)
    metrics: dict[str, Any] = {}
    failure: Exception | None = None
    try:
        metrics = learner.update(data)
    except Exception as exc:
        failure = exc
    bad = _diverged(learner, before)
    if not bad:
        if failure is not None:
            raise failure
        return metrics, None
    last = f"; the last checkpoint is in {ck.root}" if ck is not None else ""
    how = f" (then it failed: {type(failure).__name__}: {failure})" if failure else ""
    stop = RunStopped(
        f"round {rounds} ({used} episodes): the update left the parameters of "
        f"{', '.join(bad)}{how}{last}; lower the learning rates, then --resume"
    )
    stop.__cause__ = failure
    return metrics, stop


def _record(record: Callable[[list[Any], int, int], None], data: Any, rounds: int, used: int):
    """Pass a round's data to ``record`` when it is a list of episodes (CRAFT's rounds
    are chunk decisions, not episodes: nothing is recorded)."""
    from rlpost.robot.demos import Episode

    if isinstance(data, list) and data and all(isinstance(e, Episode) for e in data):
        record(data, rounds, used)


def _due(every: int, rounds: int, last: bool) -> bool:
    """Whether round ``rounds`` is checkpointed: every ``every`` rounds and the last (0:
    never)."""
    return every > 0 and (rounds % every == 0 or last)


def online_loop(
    learner: OnlineLearner,
    episodes: int,
    envs: int,
    seed: int,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    desc: str = "episodes",
    checkpoints: Checkpoints | None = None,
) -> list[dict[str, Any]]:
    """Spend ``episodes`` online episodes in rounds of ``envs``: ``collect`` then
    ``update``; returns one row per round (``episodes`` used so far, the learner's
    metrics, ``seconds`` since the start), each also passed to ``log``.

    ``checkpoints`` (see :class:`Checkpoints`): after a round is logged, a checkpoint
    ``step-<episodes used>`` every ``every`` rounds and after the last; with ``resume``,
    the loop first restores that checkpoint (learner, generators, history) and continues
    with the next round, so it ends as the uninterrupted run would (rows of the restored
    rounds are not passed to ``log`` again).
    """
    from tqdm.auto import tqdm

    history: list[dict[str, Any]] = []
    used = rounds = 0
    if checkpoints is not None and checkpoints.resume is not None:
        history, used, rounds = _restore_round(learner, checkpoints.resume)
    t0 = time.perf_counter() - (history[-1]["seconds"] if history else 0.0)
    bar = tqdm(total=episodes, initial=min(used, episodes), disable=not progress, desc=desc)
    try:
        with training_loop():  # a ValueError raised here is a bug: its traceback
            while used < episodes:
                n = min(envs, episodes - used)
                data = learner.collect(n, seed * 100_003 + used)
                if checkpoints is not None and checkpoints.record is not None:
                    _record(checkpoints.record, data, rounds, used)
                used += n
                rounds += 1
                metrics, stop = _update(learner, data, rounds, used, checkpoints)
                row = {"episodes": used, **metrics, "seconds": time.perf_counter() - t0}
                history.append(row)
                if log is not None:  # before the checkpoint: a resume drops rows past it
                    log(row)
                if stop is not None:  # the round is logged, then the run stops, unsaved
                    raise stop
                if checkpoints is not None and _due(checkpoints.every, rounds, used >= episodes):
                    _save_round(learner, checkpoints, rounds, used, history)
                bar.update(n)
                bar.set_postfix(success=f"{row.get('online_success', float('nan')):.2f}")
    finally:
        bar.close()
    return history


__all__ = [
    "Checkpoints",
    "ChunkBuffer",
    "LearnerState",
    "OnlineLearner",
    "ReplayLearner",
    "checkpoint_state",
    "chunk_transitions",
    "collect_with",
    "evaluate_policy",
    "force_stats",
    "online_loop",
]
