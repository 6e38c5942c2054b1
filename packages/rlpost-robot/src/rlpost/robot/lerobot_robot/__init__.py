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

The package follows lerobot's plugin layout (``config_mujoco_robot.py`` beside the robot,
which this package exports), so lerobot's own ``make_robot_from_config`` builds
``MujocoRobot`` from a ``MujocoRobotConfig`` as it builds any registered robot.

Requires the ``lerobot`` extra (``pip install rlpost-robot[lerobot]``).
"""

try:
    import lerobot.robots  # noqa: F401
except ImportError as exc:  # pragma: no cover - the default dev environment has lerobot
    raise ImportError(
        "rlpost.robot.lerobot_robot needs lerobot: pip install 'rlpost-robot[lerobot]'"
    ) from exc

from rlpost.robot.lerobot_robot.config_mujoco_robot import MujocoRobotConfig
from rlpost.robot.lerobot_robot.mujoco_robot import MujocoRobot, deploy, observation_vector

__all__ = ["MujocoRobot", "MujocoRobotConfig", "deploy", "observation_vector"]
