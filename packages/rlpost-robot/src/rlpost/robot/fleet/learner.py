"""The fleet's learner: an algorithm's updates on the store's episodes (LWD's DIVL + QAM
by default), one version at a time, with checkpoints it resumes from.

:class:`FleetLearner` (a Ray actor in :mod:`rlpost.robot.fleet.runtime`) holds the
algorithm's :class:`~rlpost.robot.algos.common.ReplayLearner` (its registered ``fleet``
class, e.g. :class:`~rlpost.robot.algos.lwd.LWDRounds`) and so its replay: the
demonstrations (offline) and the fleet's episodes (online). It sees the store's episodes
in store order through :meth:`ingest` and accounts for each exactly once:

* the *watermark* is the number of store episodes seen; an episode at an index below it
  is a duplicate and ignored (a coordinator re-sending after a restart);
* an episode whose policy version is more than ``max_staleness`` versions behind the
  learner's is *stale*: counted, kept in the store, not trained on (the staleness
  bound); every other one is *accepted* into the online replay.

:meth:`step` runs ``updates_per_version`` updates and publishes the next policy version.
Every ``save_every`` versions it writes a checkpoint (``<run>/checkpoints/step-<version>``,
the core's atomic format): the learner's exported state (for LWD: the policy, the critic,
the value distribution, the target critic, the frozen base, their optimisers, the sampling
generator), and in ``state.json`` the version, the watermark and the accepted indices.
The replay is not copied into the checkpoint: a restarted learner reads its accepted
episodes back from the store, so it resumes with the replay it had, and the episodes past
its watermark come to it again.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["FleetLearner"]


class FleetLearner:
    def __init__(
        self,
        policy_dir: str,
        demos: list[Any],
        params: dict[str, Any],
        run_dir: str,
        store_root: str,
        *,
        resume: bool = False,
        min_version: int = 0,
        max_staleness: int = 8,
        updates_per_version: int = 10,
        save_every: int = 10,
        keep_checkpoints: int = 2,
        snapshot_every: int = 0,
        threads: int = 1,
        algo: str = "lwd",
    ):
        torch.set_num_threads(threads)
        from rlpost.core.io.checkpoint import find_checkpoint
        from rlpost.robot.algos import ALGORITHMS
        from rlpost.robot.pretrain import load_bc_policy

        algorithm = ALGORITHMS.get(algo)
        config = algorithm.config(**params)
        self.learner = algorithm.fleet_learner()(load_bc_policy(policy_dir), demos, config)
        self.run_dir = Path(run_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.store_root = store_root
        self.max_staleness = max_staleness
        self.updates_per_version = updates_per_version
        self.save_every, self.keep, self.snapshot_every = (
            save_every,
            keep_checkpoints,
            snapshot_every,
        )
        self.version = 0
        self.watermark = 0
        self.accepted: list[int] = []
        self.stale_indices: list[int] = []
        self.duplicates = 0
        self.updates = 0
        self.resumed_from: str | None = None
        ckpt = None
        if resume:
            ckpt, _ = find_checkpoint(self.ckpt_root)
        if ckpt is not None:
            self._restore(ckpt)
        else:
            self.updates = self.learner.warm_up()
        # versions only grow: a restarted learner publishes past anything published before
        self.version = max(self.version, int(min_version))
        if ckpt is None:
            self.save()

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "watermark": self.watermark,
            "accepted": self.accepted,
            "stale": self.stale_indices,
            "updates": self.updates,
        }

    def save(self) -> str:
        from rlpost.core.io.checkpoint import save_checkpoint

        st = self.learner.export_state()  # (its replay is the store's: not saved)
        path = save_checkpoint(
            self.ckpt_root, self.version, st.model, st.optimizer, None,
            {"fleet": {**self._state(), **st.state}}, keep=self.keep, extras=st.extras,
            generators=st.generators,
        )  # fmt: skip
        return str(path)

    def _restore(self, path: Path) -> None:
        from rlpost.core.io.checkpoint import load_checkpoint
        from rlpost.robot.fleet.store import ExperienceStore

        st = self.learner.export_state()
        state = load_checkpoint(
            path, st.model, st.optimizer, None, extras=st.extras, generators=st.generators
        )
        if "fleet" not in state:
            raise ValueError(f"checkpoint {path} was not written by the fleet learner")
        s = state["fleet"]
        self.version, self.watermark = int(s["version"]), int(s["watermark"])
        self.accepted = [int(i) for i in s["accepted"]]
        self.stale_indices = [int(i) for i in s["stale"]]
        self.updates = int(s["updates"])
        self.learner.restore(s)
        store = ExperienceStore.open_read(self.store_root)
        self._forget_quarantined(len(store))
        if self.accepted:  # the replay it had: its accepted episodes, from the store
            self.learner.add(store.read(self.accepted))
        self.resumed_from = str(path)

    def _forget_quarantined(self, stored: int) -> None:
        """The store's recovery moved its damaged tail aside after this checkpoint saw it:
        forget those indices (the store records new episodes there), so the replay is the
        store's and the next episode is taken from index ``stored``. (What the weights
        learnt from them stays.)"""
        if self.watermark <= stored:
            return
        from rlpost.core.io.notice import notice

        lost = sum(i >= stored for i in self.accepted)
        notice(
            f"fleet learner: the store holds {stored} episodes, its checkpoint had seen "
            f"{self.watermark}; the quarantined {self.watermark - stored} are forgotten "
            f"({lost} were in its replay)"
        )
        self.watermark = stored
        self.accepted = [i for i in self.accepted if i < stored]
        self.stale_indices = [i for i in self.stale_indices if i < stored]

    # ------------------------------------------------------------------ experience
    def ingest(self, index: int, episode: Any) -> str:
        """Store episode ``index`` (the store's order): ``accepted``, ``stale`` or
        ``duplicate``. Indices must arrive in order from the watermark on."""
        if index < self.watermark:
            self.duplicates += 1
            return "duplicate"
        if index > self.watermark:
            raise ValueError(
                f"fleet learner: store episode {index} arrived before {self.watermark}"
            )
        self.watermark += 1
        if self.version - int(episode.policy_version) > self.max_staleness:
            self.stale_indices.append(index)
            return "stale"
        self.learner.add([episode])
        self.accepted.append(index)
        return "accepted"

    # ------------------------------------------------------------------ updates
    def weights(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.learner.policy.state_dict().items()}

    def accounting(self) -> dict[str, list[int]]:
        """The store indices trained on (``accepted``) and left out as ``stale``."""
        return {"accepted": list(self.accepted), "stale": list(self.stale_indices)}

    def info(self) -> dict[str, Any]:
        return {
            **self._state(),
            "accepted": len(self.accepted),
            "stale": len(self.stale_indices),
            "duplicates": self.duplicates,
            "resumed_from": self.resumed_from,
            "pid": os.getpid(),
        }

    def step(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """``updates_per_version`` updates, then the next version: ``(metrics, weights)``."""
        ln = self.learner
        t0 = time.perf_counter()
        ln.policy.train()
        m = ln.train(self.updates_per_version)
        ln.policy.eval()
        self.updates += self.updates_per_version
        self.version += 1
        if self.save_every and self.version % self.save_every == 0:
            self.save()
        if self.snapshot_every and self.version % self.snapshot_every == 0:
            self._snapshot()
        metrics = {
            **m,
            "version": self.version,
            "updates": self.updates,
            "watermark": self.watermark,
            "accepted": len(self.accepted),
            "stale": len(self.stale_indices),
            "buffer": ln.online_size(),
            "update_seconds": time.perf_counter() - t0,
        }
        if not all(np.isfinite(v) for v in m.values()):
            from rlpost.core.guard import RunStopped

            raise RunStopped(f"fleet learner: non-finite update at version {self.version}: {m}")
        return metrics, self.weights()

    def _snapshot(self) -> None:
        """The policy of this version in ``<run>/policies/v-<version>`` (for evaluation)."""
        final = self.run_dir / "policies" / f"v-{self.version:06d}"
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.learner.policy.save(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
