"""The deploy loop speaks lerobot's ``Robot`` interface; this module provides a MuJoCo robot.

``MujocoRobot`` implements lerobot's ``Robot`` (``connect``, ``get_observation``,
``send_action``, ``disconnect``, feature dicts) over one of our simulated tasks
(:func:`rlpost.robot.envs.make_env`), so the same :func:`deploy` loop that drives it drives
any lerobot-supported arm: replace ``MujocoRobot`` by ``make_robot_from_config(...)`` of
a real robot whose observation / action features have the same names.

Features are flat, as lerobot's are: ``state.<i>`` floats for the observation vector,
``action.<j>`` floats for the normalised action (in [-1, 1]). The task's per-step
``success`` and ``contact_force`` are exposed as observation features too, so a force-safety
monitor can read them like a real robot's force sensor.

Requires the ``lerobot`` extra (``pip install rlpost-robot[lerobot]``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    from lerobot.robots import Robot, RobotConfig
    from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError
except ImportError as exc:  # pragma: no cover - the default dev environment has lerobot
    raise ImportError(
        "rlpost.robot.lerobot_robot needs lerobot: pip install 'rlpost-robot[lerobot]'"
    ) from exc

from rlpost.robot.envs import TASKS, make_env


@RobotConfig.register_subclass("rlpost_mujoco")
@dataclass
class MujocoRobotConfig(RobotConfig):
    """``task``: a key of :data:`rlpost.robot.envs.TASKS`. lerobot's base config adds
    ``id`` and ``calibration_dir`` (the base class creates that folder even though a
    simulated robot has nothing to calibrate; pass a ``Path`` in tests)."""

    task: str = "reacher"
    seed: int = 0


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
