"""One robot of a fleet: a lerobot ``Robot``, its copy of the policy and its operator.

:class:`FleetRobot` runs whole episodes through lerobot's ``Robot`` interface, the one
the deploy loop drives (``get_observation`` -> policy -> ``send_action``, features
matched by name), built as ``rlpost-robot deploy`` builds its robot
(:func:`rlpost.robot.jobs.build_robot`: lerobot's ``make_robot_from_config``): a
:class:`~rlpost.robot.lerobot_robot.MujocoRobot` with the robot's
:class:`~rlpost.robot.fleet.variants.RobotVariant` in simulation (``fleet.robot.type:
rlpost_mujoco``), any lerobot robot on hardware (its ``type`` and ``params``; a robot
that reports no ``distance`` is never taken over by the scripted operator). Its :class:`~rlpost.robot.fleet.human.ScriptedHuman` takes over when progress
stalls; those steps are labelled ``intervention``. Every episode records the policy
version that acted (weights change only between episodes). An episode exists only once
it has ended: a robot that dies mid-episode leaves nothing behind.

``realtime`` paces the simulation: each control step takes at least ``1 / (fps *
realtime)`` seconds of wall time (a real robot's pace, sped up ``realtime`` times), so a
fleet's experience grows with its size as a real fleet's does; 0 runs as fast as the
CPU allows. On Ray each robot is an actor of this class (:mod:`rlpost.robot.fleet.runtime`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["FleetRobot"]


class FleetRobot:
    def __init__(
        self,
        index: int,
        task: str,
        robot: dict[str, Any],
        policy_config: dict[str, Any],
        sample_steps: int,
        intervention: dict[str, Any],
        realtime: float,
        seed: int,
        workdir: str,
        threads: int = 1,
    ):
        if threads:
            torch.set_num_threads(threads)
        from rlpost.robot.envs import TASKS
        from rlpost.robot.features import FeatureMap
        from rlpost.robot.fleet.human import InterventionConfig, ScriptedHuman
        from rlpost.robot.jobs import build_robot
        from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

        self.index, self.task, self.spec = index, task, TASKS[task]
        params = {"id": f"fleet-{index}", **robot.get("params", {})}
        kind = robot.get("type", "rlpost_mujoco")
        self.robot = build_robot(kind, params, task, seed, Path(workdir) / f"robot-{index}")
        self.features = getattr(self.robot, "features", None) or FeatureMap.for_task(task)
        self.features.check(
            self.robot.observation_features, self.robot.action_features, f"robot {kind!r}"
        )
        self.robot.connect()
        self.policy = FlowChunkPolicy(FlowPolicyConfig.from_dict(policy_config)).eval()
        self.sample_steps = sample_steps
        self.human = ScriptedHuman(task, InterventionConfig(**intervention), seed)
        self.realtime = realtime
        self.version: int | None = None
        self.fps = float(self.spec.fps)

    def pid(self) -> int:
        return os.getpid()

    def load(self, state: dict[str, Tensor], version: int) -> int:
        """Take the weights of policy ``version``; returns the version now held."""
        self.policy.load_state_dict(state, strict=True)
        self.version = int(version)
        return self.version

    def run(
        self,
        episode_id: int,
        seed: int,
        version: int,
        weights: dict[str, Tensor] | None = None,
    ) -> Any:
        """One whole episode (reset with ``seed``) under policy ``version`` (loading
        ``weights`` first when they are a newer version than the robot holds); returns an
        :class:`rlpost.robot.demos.Episode` with the fleet fields filled in."""
        from rlpost.robot.demos import Episode
        from rlpost.robot.policies.bc import ChunkController

        if weights is not None and version != self.version:
            self.load(weights, version)
        if self.version is None:
            raise RuntimeError(f"robot {self.index}: no policy weights loaded")
        robot, feats = self.robot, self.features
        ctrl = ChunkController(
            self.policy, execute=self.policy.cfg.horizon, n_steps=self.sample_steps, seed=seed
        )
        if hasattr(robot, "reset"):  # a real arm: its reset moves it home
            robot.reset(seed)
        self.human.reset()
        obs = feats.observation_vector(robot.get_observation()).astype(np.float32)
        dist = getattr(robot, "last_info", {}).get("distance")
        observations, actions, human, successes = [obs], [], [], []
        period = 1.0 / (self.fps * self.realtime) if self.realtime > 0 else 0.0
        tick = time.perf_counter()
        for _ in range(self.spec.max_steps):
            a = self.human.act(obs, dist)
            if a is None:
                a, drove = ctrl(obs), False
            else:
                ctrl.reset()  # the policy replans from wherever the operator leaves it
                drove = True
            sent = robot.send_action(feats.action_dict(np.asarray(a, dtype=np.float32)))
            frame = robot.get_observation()
            obs = feats.observation_vector(frame).astype(np.float32)
            dist = getattr(robot, "last_info", {}).get("distance")
            observations.append(obs)
            actions.append(np.array([sent[k] for k in feats.action], dtype=np.float32))
            human.append(drove)
            successes.append(bool(frame.get("success", 0.0)))
            if period:
                tick += period
                time.sleep(max(0.0, tick - time.perf_counter()))
            if getattr(robot, "episode_done", False):  # else the task's time limit
                break
        success = successes[-1]
        terminated = success and self.spec.terminates_on_success
        n = len(actions)
        rewards = np.zeros(n, dtype=np.float32)
        rewards[-1] = float(success)  # sparse: the success a deployed robot can report
        return Episode(
            obs=np.stack(observations),
            actions=np.stack(actions),
            rewards=rewards,
            success=success,
            metrics={
                "return": float(success),
                "length": n,
                "success": success,
                "ever_success": any(successes),
                "interventions": self.human.count,
            },
            terminated=terminated,
            step_success=np.asarray(successes, dtype=bool),
            task=self.task,
            seed=seed,
            intervention=np.asarray(human, dtype=bool),
            policy_version=self.version,
            robot=self.index,
            episode_id=episode_id,
        )

    def close(self) -> None:
        if self.robot.is_connected:
            self.robot.disconnect()
