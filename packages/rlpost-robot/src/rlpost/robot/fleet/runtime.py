"""The fleet on Ray: robot actors, a learner actor, the store, and the loop that joins them.

:class:`FleetRuntime` is the driver of ``rlpost-robot fleet``. It starts (or joins, with
``fleet.ray_address``) Ray, one :class:`~rlpost.robot.fleet.robot.FleetRobot` actor per
robot and one :class:`~rlpost.robot.fleet.learner.FleetLearner` actor, then loops:

* a robot's finished episode is appended to the :class:`~rlpost.robot.fleet.store.ExperienceStore`
  (the record: on disk before anything else sees it), handed to the learner by its
  store index, and the robot is given its next episode with the latest weights (the
  weights travel through Ray's object store; a robot that holds the latest version is
  sent none);
* the learner's step returns the next policy version's metrics and, as a second object
  in Ray's store, its weights; the driver logs a row per version and asks for the next.

Faults, each tested:

* a robot actor that dies mid-episode leaves nothing (its episode existed only in its
  memory); the driver starts a new actor in its place and dispatches the same episode id
  and seed again, so the store holds each id once;
* a learner actor that dies is started again from its last checkpoint; it reads back
  the episodes it had accepted from the store, and the driver hands it every store
  episode past its watermark, so each store episode is accounted exactly once;
* a driver that dies (the whole run) continues with ``--resume``: the store recovers
  to its last whole episode, the learner resumes from its checkpoint, the time budget
  left is read back, and episode ids continue after the store's last.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FleetRuntime", "RobotSlot"]


@dataclass
class RobotSlot:
    """The driver's view of one robot."""

    index: int
    variant: Any
    actor: Any = None
    ref: Any = None
    job: tuple[int, int] | None = None  # (episode id, seed) in flight
    version: int | None = None  # the policy version the actor holds
    since: float = 0.0  # when the episode in flight was dispatched (time.monotonic)
    episodes: int = 0
    interventions: int = 0
    restarts: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=20))  # autonomous successes


def _episode_seed(seed: int, episode_id: int, stream: int = 7) -> int:
    """A 31-bit seed of episode ``episode_id`` (``stream`` 11: of robot ``episode_id``)."""
    return int(np.random.SeedSequence([seed, stream, episode_id]).generate_state(1)[0] >> 1)


class FleetRuntime:
    """One fleet run in ``out`` (see the module docstring); :meth:`run` then :meth:`close`."""

    def __init__(self, job: Any, out: Path, resume: bool = False, progress: bool = True):
        from rlpost.core.io.rundir import notice
        from rlpost.robot.fleet.store import ExperienceStore
        from rlpost.robot.pretrain import demo_source

        self.job, self.out, self.progress = job, Path(out).resolve(), progress
        self.store, recovery = ExperienceStore.open(self.out / "store", job.task)
        if resume or not recovery.clean:
            notice(str(recovery))
        self.recovery = str(recovery)
        self._view_stale = not self.store.view_ok  # damaged: rebuilt from the spool at once
        source = demo_source(job.task, job.demos.model_dump())
        self.policy_dir = Path(job.policy.build(job.task, source, progress))
        self.policy_dir = self.policy_dir.resolve()
        self.demos = source.load()
        self.variants = job.fleet.variant_list()
        from rlpost.robot.jobs import build_robot  # a bad robot type or config: say so here

        build_robot(job.robot.type, job.robot.params, job.task, job.run.seed, self.out / "robots")
        self.state_file = self.out / "fleet_state.json"
        saved = (
            json.loads(self.state_file.read_text()) if resume and self.state_file.is_file() else {}
        )
        self.elapsed0 = float(saved.get("elapsed", 0.0))
        self.version = int(saved.get("version", 0))
        self.learner_restarts = int(saved.get("learner_restarts", 0))
        self.robot_restarts = int(saved.get("robot_restarts", 0))
        ids = self.store.episode_ids()
        self.next_id = max(ids, default=-1) + 1
        self.ray = None
        self._started_ray = False
        self._local_ray: Any = None
        self._resume = resume
        self.slots = [
            RobotSlot(i, self.variants[i % len(self.variants)]) for i in range(job.fleet.robots)
        ]
        self.learner = None
        self.weights_ref = None
        self._step = None  # (metrics ref, weights ref) of the learner step in flight
        self._view_ref = None
        self._view_at = len(self.store)
        self.rows: list[dict[str, Any]] = []
        self.log: Any = None
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ actors
    def start(self) -> None:
        from rlpost.robot.fleet.learner import FleetLearner
        from rlpost.robot.fleet.robot import FleetRobot

        ray = _import_ray(local=not self.job.fleet.ray_address)
        self.ray = ray
        if not ray.is_initialized():
            if self.job.fleet.ray_address:
                ray.init(
                    address=self.job.fleet.ray_address,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            else:  # on the loopback, gone with this process; logical CPUs: robots mostly wait
                from rlpost.core.ray_local import init_local_ray

                self._local_ray = init_local_ray(ray, num_cpus=len(self.slots) + 2)
            self._started_ray = True
        self._robot_cls = ray.remote(num_cpus=1, max_restarts=0)(FleetRobot)
        self._learner_cls = ray.remote(num_cpus=1, max_restarts=0)(FleetLearner)
        self._demos_ref = ray.put(self.demos)
        from rlpost.robot.policies.flow import FlowPolicyConfig

        cfg = json.loads((Path(self.policy_dir) / "policy" / "config.json").read_text())
        cfg.pop("kind", None)
        self._policy_config = FlowPolicyConfig.from_dict(cfg).to_dict()
        for slot in self.slots:
            slot.actor = self._spawn_robot(slot)
        self._start_learner(
            resume=self._resume, min_version=self.version + (1 if self._resume else 0)
        )

    def _spawn_robot(self, slot: RobotSlot) -> Any:
        job = self.job
        robot = {"type": job.robot.type, "params": dict(job.robot.params)}
        if job.robot.type == "rlpost_mujoco":  # the simulated robot of this variant
            robot["params"]["variant"] = slot.variant.to_dict()
        return self._robot_cls.remote(
            slot.index, job.task, robot, self._policy_config,
            job.learner.algo_config(job.run.seed).sample_steps, dict(job.intervention),
            job.fleet.realtime, _episode_seed(job.run.seed, slot.index, 11),
            str(self.out / "robots"),
        )  # fmt: skip

    def _start_learner(self, resume: bool, min_version: int) -> None:
        ls, job = self.job.learner, self.job
        self.learner = self._learner_cls.remote(
            str(self.policy_dir), self._demos_ref, {**ls.params, "seed": job.run.seed},
            str(self.out), str(self.store.root), resume=resume, min_version=min_version,
            max_staleness=ls.max_staleness, updates_per_version=ls.updates_per_version,
            save_every=ls.save_every, keep_checkpoints=ls.keep_checkpoints,
            snapshot_every=ls.snapshot_every, algo=ls.algo,
        )  # fmt: skip
        info = self.ray.get(self.learner.info.remote())
        self.version = int(info["version"])
        self.weights_ref = self.learner.weights.remote()
        for i in range(int(info["watermark"]), len(self.store)):  # what it has not seen yet
            self.learner.ingest.remote(i, self.store.read([i])[0])
        self.learner_info = info
        self._step = None

    def restart_learner(self) -> None:
        """Replace a dead learner actor: from its last checkpoint, versions past any
        published, every store episode past its watermark handed to it again."""
        with contextlib.suppress(Exception):
            self.ray.kill(self.learner)
        self.learner_restarts += 1
        self._start_learner(resume=True, min_version=self.version + 1)

    def restart_robot(self, slot: RobotSlot) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(slot.actor)
        slot.actor = self._spawn_robot(slot)
        slot.version = None
        slot.restarts += 1
        self.robot_restarts += 1

    def dispatch(self, slot: RobotSlot, job: tuple[int, int] | None = None) -> None:
        """Give ``slot`` its next episode (or ``job``, an episode id and seed to redo)."""
        if job is None:
            job = (self.next_id, _episode_seed(self.job.run.seed, self.next_id))
            self.next_id += 1
        weights = self.weights_ref if slot.version != self.version else None
        slot.ref = slot.actor.run.remote(job[0], job[1], self.version, weights)
        slot.job, slot.version, slot.since = job, self.version, time.monotonic()

    # ------------------------------------------------------------------ the loop
    def _on_episode(self, slot: RobotSlot) -> None:
        ray = self.ray
        try:
            ep = ray.get(slot.ref)
        except ray.exceptions.RayActorError:  # died mid-episode: nothing of it was kept
            job = slot.job
            self.restart_robot(slot)
            self.dispatch(slot, job)
            return
        except ray.exceptions.RayTaskError as exc:
            raise _cause(exc) from None
        index = self.store.append(ep)
        self.learner.ingest.remote(index, ep)
        slot.episodes += 1
        human = bool(ep.intervention is not None and ep.intervention.any())
        slot.interventions += int(human)
        slot.recent.append(bool(ep.success and not human))
        self.dispatch(slot)

    def _on_step(self) -> None:
        ray = self.ray
        metrics_ref, weights_ref = self._step
        self._step = None
        try:
            m = ray.get(metrics_ref)
        except ray.exceptions.RayActorError:
            self.restart_learner()
            return
        except ray.exceptions.RayTaskError as exc:
            raise _cause(exc) from None
        self.version = int(m["version"])
        self.weights_ref = weights_ref
        self._log_row(m)

    def _log_row(self, m: dict[str, Any]) -> None:
        recent = [s for slot in self.slots for s in slot.recent]
        row = {
            **m,
            "episodes": len(self.store),
            "fleet/success_recent": float(np.mean(recent)) if recent else 0.0,
            "fleet/interventions": sum(s.interventions for s in self.slots),
            "fleet/robot_restarts": self.robot_restarts,
            "fleet/learner_restarts": self.learner_restarts,
            "seconds": self.elapsed(),
        }
        self.rows.append(row)
        if self.log is not None:
            self.log(row)
        self._save_state()

    def elapsed(self) -> float:
        return self.elapsed0 + (time.monotonic() - self._t0)

    def _save_state(self) -> None:
        state = {
            "elapsed": self.elapsed(),
            "version": self.version,
            "episodes": len(self.store),
            "learner_restarts": self.learner_restarts,
            "robot_restarts": self.robot_restarts,
        }
        tmp = self.state_file.with_name(f"fleet_state.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)

    def run(self, log: Any = None, until: Any = None) -> None:
        """Run until the time budget (``fleet.minutes``) or ``fleet.max_episodes`` is spent
        (or ``until(self)`` says so). In-flight episodes at the end are discarded."""
        self.log = log
        self._t0 = time.monotonic()
        if self.learner is None:
            self.start()
        budget = self.job.fleet.minutes * 60.0
        cap = self.job.fleet.max_episodes
        for slot in self.slots:
            if slot.ref is None:
                self.dispatch(slot)
        live = _Progress(self) if self.progress else None
        try:
            while self.elapsed() < budget and (cap is None or len(self.store) < cap):
                if until is not None and until(self):
                    break
                if self._step is None:
                    self._step = self.learner.step.options(num_returns=2).remote()
                refs = {slot.ref: slot for slot in self.slots}
                ready, _ = self.ray.wait([*refs, self._step[0]], num_returns=1, timeout=0.25)
                for ref in ready:
                    if ref in refs:
                        self._on_episode(refs[ref])
                    elif self._step is not None and ref == self._step[0]:
                        self._on_step()
                self._maybe_build_view()
                if live is not None:
                    live.update()
        finally:
            if live is not None:
                live.close()

    def _maybe_build_view(self) -> None:
        every = self.job.fleet.view_every
        if self._view_ref is not None:
            done, _ = self.ray.wait([self._view_ref], timeout=0)
            if not done:
                return
            self.ray.get(self._view_ref)
            self._view_ref = None
        if self._view_stale or (every and len(self.store) - self._view_at >= every):
            self._view_at = len(self.store)
            self._view_ref = _build_view_task(self.ray).remote(
                str(self.store.root), self._view_stale
            )
            self._view_stale = False

    # ------------------------------------------------------------------ the end
    def finish(self) -> dict[str, Any]:
        """Stop the robots (in-flight episodes are discarded), checkpoint the learner,
        bring the LeRobotDataset up to date; returns the learner's final info."""
        ray = self.ray
        for slot in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.actor)
            slot.ref = None
        if self._view_ref is not None:
            with contextlib.suppress(Exception):
                ray.get(self._view_ref)
        info: dict[str, Any] = {}
        for _ in range(2):  # one more learner restart if it died right at the end
            try:
                if self._step is not None:
                    with contextlib.suppress(ray.exceptions.RayTaskError):
                        ray.get(self._step[0])
                    self._step = None
                ray.get(self.learner.save.remote())
                info = ray.get(self.learner.info.remote())
                self.final_weights = ray.get(self.learner.weights.remote())
                break
            except ray.exceptions.RayActorError:
                self.restart_learner()
        self.version = int(info.get("version", self.version))
        self._save_state()
        self.store.build_view(rebuild=self._view_stale)
        return info

    def close(self) -> None:
        if self.ray is None:
            return
        for slot in self.slots:
            with contextlib.suppress(Exception):
                self.ray.kill(slot.actor)
        with contextlib.suppress(Exception):
            self.ray.kill(self.learner)
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
        if self._local_ray is not None:
            self._local_ray.stop()
            self._local_ray = None
        self.ray = None


def _cause(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def _import_ray(local: bool = True) -> Any:
    """``ray``; for a local cluster without Ray's ``uv run`` hook: under ``uv run`` it
    would package the working directory as every actor's runtime environment and start
    each actor through ``uv run`` (half a minute per session on 2 cores, and the actors'
    working directory would be the package), for actors that run in this very
    environment. Ray reads the switch when it is imported."""
    if local and "ray" not in sys.modules:
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import ray
    except ImportError:
        from rlpost.core import MissingDependency

        raise MissingDependency(
            "rlpost-robot fleet runs on Ray, which is not installed: pip install 'ray>=2.40'"
        ) from None
    return ray


def _build_view(root: str, rebuild: bool = False) -> int:
    from rlpost.robot.fleet.store import ExperienceStore

    return ExperienceStore.open_read(root).build_view(rebuild)


_VIEW_TASK: dict[int, Any] = {}


def _build_view_task(ray: Any) -> Any:
    if id(ray) not in _VIEW_TASK:
        _VIEW_TASK[id(ray)] = ray.remote(num_cpus=0)(_build_view)
    return _VIEW_TASK[id(ray)]


class _Progress:
    """A live table of the fleet (rich): per robot its variant, episodes, autonomous
    success of its last 20, interventions, policy version held and restarts."""

    def __init__(self, rt: FleetRuntime):
        from rich.console import Console
        from rich.live import Live

        self.rt = rt
        self.console = Console(stderr=True)
        self.live = Live(self._table(), console=self.console, auto_refresh=False, transient=False)
        self.live.start()
        self._last = 0.0

    def _table(self) -> Any:
        from rich.table import Table

        rt = self.rt
        budget = rt.job.fleet.minutes * 60
        t = Table(
            title=f"fleet: {len(rt.slots)} robots, policy v{rt.version}, "
            f"{len(rt.store)} episodes, {rt.elapsed():.0f}/{budget:.0f} s",
            title_justify="left",
        )
        for col in (
            "robot",
            "variant",
            "episodes",
            "success (last 20)",
            "interventions",
            "holds",
            "restarts",
        ):
            t.add_column(col, justify="right" if col != "variant" else "left")
        for s in rt.slots:
            succ = f"{np.mean(s.recent):.2f}" if s.recent else "-"
            held = "-" if s.version is None else f"v{s.version}"
            t.add_row(
                str(s.index), s.variant.name, str(s.episodes), succ, str(s.interventions),
                held, str(s.restarts),
            )  # fmt: skip
        if rt.rows:
            r = rt.rows[-1]
            t.caption = (
                f"learner: {r['updates']} updates, buffer {r['buffer']} chunks, "
                f"{r['stale']} stale episodes, q {r.get('q_mean', 0):.3f}, "
                f"{rt.learner_restarts} restarts"
            )
        return t

    def update(self) -> None:
        now = time.monotonic()
        if now - self._last >= 0.5:
            self._last = now
            self.live.update(self._table(), refresh=True)

    def close(self) -> None:
        self.live.update(self._table(), refresh=True)
        self.live.stop()
        if not self.console.is_terminal:  # rich ends the last render with a newline only on a tty
            self.console.line()
