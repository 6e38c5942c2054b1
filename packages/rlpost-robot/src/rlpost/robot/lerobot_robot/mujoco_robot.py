"""A simulated robot behind lerobot's ``Robot`` interface, and the deploy loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from lerobot.robots import Robot
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from rlpost.robot.envs import TASKS, make_env
from rlpost.robot.lerobot_robot.config_mujoco_robot import MujocoRobotConfig


class MujocoRobot(Robot):
    """A simulated robot behind lerobot's ``Robot`` interface."""

    config_class = MujocoRobotConfig
    name = "rlpost_mujoco"

    def __init__(self, config: MujocoRobotConfig):
        if config.task not in TASKS:
            raise ValueError(f"unknown task {config.task!r}; valid: {sorted(TASKS)}")
        super().__init__(config)
        self.config = config
        self.spec = TASKS[config.task]
        self.env = None
        self._obs: np.ndarray | None = None
        self._info: dict[str, Any] = {}
        self.episode_done = False

    # ---------------------------------------------------------------- features

    @property
    def observation_features(self) -> dict[str, type]:
        feats: dict[str, type] = {f"state.{i}": float for i in range(self.spec.obs_dim)}
        feats["success"] = float
        if self.spec.has_force:
            feats["contact_force"] = float
        return feats

    @property
    def action_features(self) -> dict[str, type]:
        return {f"action.{j}": float for j in range(self.spec.act_dim)}

    # ---------------------------------------------------------------- lifecycle

    @property
    def is_connected(self) -> bool:
        return self.env is not None

    def connect(self, calibrate: bool = True) -> None:
        if self.is_connected:
            raise DeviceAlreadyConnectedError(f"{self} is already connected")
        self.env = make_env(self.config.task, seed=self.config.seed)
        self.reset(self.config.seed)
        self.configure()

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:  # nothing to calibrate in simulation
        pass

    def configure(self) -> None:
        pass

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (a real arm would move to its home pose here)."""
        self._require()
        self._obs, self._info = self.env.reset(seed=seed)
        self.episode_done = False

    def disconnect(self) -> None:
        if not self.is_connected:
            raise DeviceNotConnectedError(f"{self} is not connected")
        self.env.close()
        self.env = None

    # ---------------------------------------------------------------- I/O

    def _require(self) -> None:
        if self.env is None:
            raise DeviceNotConnectedError(f"{self} is not connected")

    def get_observation(self) -> dict[str, Any]:
        self._require()
        obs = {f"state.{i}": float(v) for i, v in enumerate(self._obs)}
        obs["success"] = float(bool(self._info.get("success", False)))
        if self.spec.has_force:
            obs["contact_force"] = float(self._info.get("contact_force", 0.0))
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        """Apply one action (clipped to [-1, 1]); returns the action actually sent."""
        self._require()
        missing = [k for k in self.action_features if k not in action]
        if missing:
            raise KeyError(f"action is missing {missing}")
        a = np.clip(
            np.array([float(action[k]) for k in self.action_features], dtype=np.float32), -1, 1
        )
        self._obs, _, terminated, truncated, self._info = self.env.step(a)
        self.episode_done = bool(terminated or truncated)
        return {k: float(v) for k, v in zip(self.action_features, a, strict=True)}

    @property
    def last_info(self) -> dict[str, Any]:
        return self._info


def observation_vector(obs: dict[str, Any], robot: Robot) -> np.ndarray:
    """The ``state.<i>`` entries of a lerobot observation dict as a float32 vector."""
    keys = [k for k in robot.observation_features if k.startswith("state.")]
    return np.array([obs[k] for k in keys], dtype=np.float32)


def deploy(
    policy: Callable[[np.ndarray], np.ndarray],
    robot: Robot,
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Run ``policy`` on ``robot`` through lerobot's interface for ``episodes`` episodes.

    Each step: ``get_observation`` -> state vector -> ``policy`` -> ``send_action``. Returns
    per-episode metrics (steps, success at the end, peak and mean contact force when the
    robot reports one). On a real arm, ``episode_done`` comes from the operator or a
    success detector; here from the simulated task.
    """
    results = []
    horizon = max_steps or getattr(getattr(robot, "spec", None), "max_steps", 1000)
    for ep in range(episodes):
        if hasattr(robot, "reset"):
            robot.reset(seed + ep)
        if hasattr(policy, "reset"):
            policy.reset()
        forces, steps, obs = [], 0, robot.get_observation()
        for steps in range(1, horizon + 1):  # noqa: B007 - steps is reported
            action = policy(observation_vector(obs, robot))
            robot.send_action(
                {k: float(v) for k, v in zip(robot.action_features, action, strict=True)}
            )
            obs = robot.get_observation()
            if "contact_force" in obs:
                forces.append(obs["contact_force"])
            if getattr(robot, "episode_done", False):
                break
        results.append(
            {
                "steps": steps,
                "success": bool(obs.get("success", 0.0)),
                "peak_force": max(forces) if forces else None,
                "mean_force": float(np.mean(forces)) if forces else None,
            }
        )
    return results
