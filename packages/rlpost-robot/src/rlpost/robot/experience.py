"""A train run's online experience, kept as a LeRobotDataset (``run.experience``).

``rlpost-robot train`` records every episode its online loop collects into
``run.dir/experience``, an :class:`~rlpost.robot.fleet.store.ExperienceStore` (the
fleet's crash-safe store: one safetensors file per episode, then a finalised
LeRobotDataset v3 at ``experience/current``). Each frame carries ``next.reward``,
``next.done``, ``next.terminated``, ``next.success`` and the fleet's columns:
``intervention`` (no human drives a train run: all false), ``policy_version`` (the
round whose policy collected it: the number of updates before), ``robot_index`` (the
environment of the round) and ``episode_id`` (its index in the run).

A resumed run first forgets the episodes recorded after its checkpoint (they are
collected again, identically), so the data set equals the uninterrupted run's. Read it
back with :func:`rlpost.robot.lerobot_data.load_lerobot_dataset`, or train on it:
``data.path=<run.dir>/experience`` puts it in another run's replay.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np


class ExperienceRecorder:
    """The ``record`` hook of :class:`~rlpost.robot.algos.common.Checkpoints` over the
    store at ``root``, keeping its first ``keep`` episodes (those a resumed checkpoint
    used)."""

    def __init__(self, root: str | Path, task: str, keep: int = 0):
        from rlpost.core.io.notice import notice
        from rlpost.robot.fleet.store import ExperienceStore

        self.store, recovery = ExperienceStore.open(root, task)
        if not recovery.clean:
            notice(f"{root}: {recovery}")
        if len(self.store) < keep:
            notice(
                f"{root}: holds {len(self.store)} of the {keep} episodes the checkpoint used; "
                "the data set will miss the others"
            )
        self.store.truncate(min(keep, len(self.store)))

    def __call__(self, episodes: list[Any], version: int, first: int) -> None:
        for j, ep in enumerate(episodes):
            human = ep.intervention if ep.intervention is not None else np.zeros(len(ep), bool)
            self.store.append(
                dataclasses.replace(
                    ep, intervention=human, policy_version=version, robot=j,
                    episode_id=first + j,
                )
            )  # fmt: skip

    def finish(self) -> dict[str, Any]:
        """Bring the LeRobotDataset up to the recorded episodes; what it holds and where
        (without the lerobot extra, the episodes stay in the spool and it says so)."""
        from rlpost.core import MissingDependency

        try:
            self.store.build_view()
        except MissingDependency as exc:
            return {"episodes": len(self.store), "path": None, "note": str(exc)}
        return {"episodes": len(self.store), "path": str(self.store.current)}
