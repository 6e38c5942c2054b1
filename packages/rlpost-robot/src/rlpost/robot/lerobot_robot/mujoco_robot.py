"""A simulated robot behind lerobot's ``Robot`` interface, and the deploy loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from lerobot.robots import Robot
from lerobot.utils.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

from rlpost.robot.envs import TASKS, make_env
from rlpost.robot.features import FeatureMap
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
        from rlpost.robot.fleet.variants import RobotVariant

        self.variant = RobotVariant.from_dict(dict(config.variant))
        self._noise = np.random.default_rng([config.seed, 1])
        self.spec = TASKS[config.task]
        self.features = FeatureMap.for_task(config.task).renamed(config.rename)
        self.env = None
        self._obs: np.ndarray | None = None
        self._info: dict[str, Any] = {}
        self.last_reward = 0.0
        self.episode_done = False

    # ---------------------------------------------------------------- features

    @property
    def observation_features(self) -> dict[str, Any]:
        """The task's observation names (``x.pos``, ``x.vel``, ``b.x``, ...) as floats, its
        camera (``front``: ``(H, W, C)``) on an image task, ``success`` and, on a contact
        task, ``contact_force``: the layout of a lerobot arm's features."""
        feats: dict[str, Any] = dict.fromkeys(self.features.observation, float)
        if self.features.image is not None:
            feats[self.features.image[0]] = self.features.image[1]
        feats["success"] = float
        if self.spec.has_force and "contact_force" not in feats:
            feats["contact_force"] = float
        return feats

    @property
    def action_features(self) -> dict[str, type]:
        """The task's action names (``x.pos`` for the position servos of ``contour``,
        ``x.vel`` for the velocity servos of ``multimodal_reach``, ``{joint}.effort`` for
        torque-driven arms); values are normalised to [-1, 1] as lerobot's are to
        [-100, 100]."""
        return dict.fromkeys(self.features.action, float)

    # ---------------------------------------------------------------- lifecycle

    @property
    def is_connected(self) -> bool:
        return self.env is not None

    def connect(self, calibrate: bool = True) -> None:
        if self.is_connected:
            raise DeviceAlreadyConnectedError(f"{self} is already connected")
        from rlpost.robot.fleet.variants import apply_variant

        self.env = make_env(self.config.task, seed=self.config.seed)
        apply_variant(self.env, self.variant)
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
        if seed is not None:
            self._noise = np.random.default_rng([seed, 1])
        self._obs, self._info = self.env.reset(seed=seed)
        self.last_reward = 0.0
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
        names = self.features.observation
        obs: dict[str, Any] = {n: float(v) for n, v in zip(names, self._obs, strict=False)}
        if self.features.image is not None:
            name, shape = self.features.image
            obs[name] = np.asarray(self._obs[len(names) :], np.float32).reshape(shape)
        obs["success"] = float(bool(self._info.get("success", False)))
        if self.spec.has_force and "contact_force" not in obs:
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
        applied = a
        if self.variant.action_noise > 0:  # the actuators' own noise, after the command
            applied = a + self._noise.normal(0.0, self.variant.action_noise, a.shape)
        self._obs, self.last_reward, terminated, truncated, self._info = self.env.step(applied)
        self.episode_done = bool(terminated or truncated)
        return {k: float(v) for k, v in zip(self.action_features, a, strict=True)}

    @property
    def last_info(self) -> dict[str, Any]:
        return self._info


def deploy(
    policy: Callable[[np.ndarray], np.ndarray],
    robot: Robot,
    episodes: int = 1,
    max_steps: int | None = None,
    seed: int = 0,
    features: FeatureMap | None = None,
) -> list[dict[str, Any]]:
    """Run ``policy`` on ``robot`` through lerobot's interface for ``episodes`` episodes.

    Each step: ``get_observation`` -> the policy's vector, assembled by name through
    ``features`` (default: the robot's own task names) -> ``policy`` -> ``send_action``
    with the robot's action names. The names are checked against the robot's features
    before the first step (``ValueError`` naming what is missing). Returns
    per-episode metrics (steps, success at the end, peak and mean contact force when the
    robot reports one). On a real arm, ``episode_done`` comes from the operator or a
    success detector; here from the simulated task.
    """
    if features is None:
        features = getattr(robot, "features", None)
        if features is None:
            raise ValueError("deploy needs features= (a FeatureMap) for a robot not of ours")
    features.check(robot.observation_features, robot.action_features, f"robot {robot}")
    results = []
    horizon = max_steps or getattr(getattr(robot, "spec", None), "max_steps", 1000)
    for ep in range(episodes):
        if hasattr(robot, "reset"):
            robot.reset(seed + ep)
        if hasattr(policy, "reset"):
            policy.reset()
        forces, steps, obs = [], 0, robot.get_observation()
        for steps in range(1, horizon + 1):  # noqa: B007 - steps is reported
            robot.send_action(features.action_dict(policy(features.observation_vector(obs))))
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
