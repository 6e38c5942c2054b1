"""The fleet's learner: LWD's DIVL + QAM updates on the store's episodes, one version at
a time, with checkpoints it resumes from.

:class:`FleetLearner` (a Ray actor in :mod:`rlpost.robot.fleet.runtime`) holds the
:class:`~rlpost.robot.algos.lwd.LWDLearner` and its replay: the demonstrations (offline)
and the fleet's episodes (online). It sees the store's episodes in store order through
:meth:`ingest` and accounts for each exactly once:

* the *watermark* is the number of store episodes seen; an episode at an index below it
  is a duplicate and ignored (a coordinator re-sending after a restart);
* an episode whose policy version is more than ``max_staleness`` versions behind the
  learner's is *stale*: counted, kept in the store, not trained on (the staleness
  bound); every other one is *accepted* into the online replay.

:meth:`step` runs ``updates_per_version`` updates and publishes the next policy version.
Every ``save_every`` versions it writes a checkpoint (``<run>/checkpoints/step-<version>``,
the core's atomic format): the policy, the critic, the value distribution, the target
critic, the frozen base, their optimisers, the sampling generator, and in ``state.json``
the version, the watermark and the accepted indices. The replay is not copied into the
checkpoint: a restarted learner reads its accepted episodes back from the store, so it
resumes with the replay it had, and the episodes past its watermark come to it again.
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
    ):
        torch.set_num_threads(threads)
        from rlpost.core.io.checkpoint import find_checkpoint
        from rlpost.robot.algos.lwd import LWDConfig, LWDLearner, ReplayMix, transitions
        from rlpost.robot.pretrain import load_bc_policy

        self.cfg = LWDConfig(**params)
        policy = load_bc_policy(policy_dir)
        self.learner = LWDLearner(policy, self.cfg)
        self.horizon = policy.cfg.horizon
        self.replay = ReplayMix(transitions(demos, self.horizon, self.cfg.gamma))
        self._transitions = transitions
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
            from rlpost.robot.algos.lwd import offline_phase

            offline_phase(self.learner, self.replay, self.cfg.offline_steps)
            self.updates = self.cfg.offline_steps
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
            "online": self.learner.online,
        }

    def save(self) -> str:
        from rlpost.core.io.checkpoint import save_checkpoint

        ln = self.learner
        path = save_checkpoint(
            self.ckpt_root, self.version, ln.policy, ln.pi_opt, None, {"fleet": self._state()},
            keep=self.keep, extras=ln.modules(), generators={"learner": ln.gen},
        )  # fmt: skip
        return str(path)

    def _restore(self, path: Path) -> None:
        from rlpost.core.io.checkpoint import load_checkpoint
        from rlpost.robot.fleet.store import ExperienceStore

        ln = self.learner
        state = load_checkpoint(
            path, ln.policy, ln.pi_opt, None, extras=ln.modules(), generators={"learner": ln.gen}
        )
        if "fleet" not in state:
            raise ValueError(f"checkpoint {path} was not written by the fleet learner")
        s = state["fleet"]
        self.version, self.watermark = int(s["version"]), int(s["watermark"])
        self.accepted = [int(i) for i in s["accepted"]]
        self.stale_indices = [int(i) for i in s["stale"]]
        self.updates, ln.online = int(s["updates"]), bool(s["online"])
        store = ExperienceStore.open_read(self.store_root)
        self._forget_quarantined(len(store))
        if self.accepted:  # the replay it had: its accepted episodes, from the store
            eps = store.read(self.accepted)
            self.replay.add(self._transitions(eps, self.horizon, self.cfg.gamma))
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
        self.replay.add(self._transitions([episode], self.horizon, self.cfg.gamma))
        self.accepted.append(index)
        self.learner.online = True
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
        c, ln = self.cfg, self.learner
        t0 = time.perf_counter()
        m: dict[str, float] = {}
        ln.policy.train()
        for _ in range(self.updates_per_version):
            b = self.replay.sample(c.batch_size, c.online_fraction, ln.gen)
            for k, v in ln.update(b).items():
                m[k] = m.get(k, 0.0) + v / self.updates_per_version
        ln.policy.eval()
        self.updates += self.updates_per_version
        self.version += 1
        if self.save_every and self.version % self.save_every == 0:
            self.save()
        if self.snapshot_every and self.version % self.snapshot_every == 0:
            self._snapshot()
        online = self.replay.online
        metrics = {
            **m,
            "version": self.version,
            "updates": self.updates,
            "watermark": self.watermark,
            "accepted": len(self.accepted),
            "stale": len(self.stale_indices),
            "buffer": 0 if online is None else len(online),
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
