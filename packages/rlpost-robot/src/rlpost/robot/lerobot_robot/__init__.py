"""The deploy loop speaks lerobot's ``Robot`` interface; this module provides a MuJoCo robot.

``MujocoRobot`` implements lerobot's ``Robot`` (``connect``, ``get_observation``,
``send_action``, ``disconnect``, feature dicts) over one of our simulated tasks
(:func:`rlpost.robot.envs.make_env`), so the same :func:`deploy` loop that drives it drives
any lerobot-supported arm: replace ``MujocoRobot`` by ``make_robot_from_config(...)`` of
a real robot whose observation / action features have the same names.

Features are flat and named, as a lerobot arm's are (``TaskSpec.obs_names`` /
``act_names``: ``x.pos``, ``x.vel``, ``b.x``, ... for ``contour``), with actions normalised to
[-1, 1]; the deploy loop maps them to the policy's vectors by name
(:class:`rlpost.robot.features.FeatureMap`), so an arm whose features carry the policy's
names (or names mapped with ``data.rename`` at training) is driven the same way. The
task's per-step ``success`` and ``contact_force`` are observation features too, so a
force-safety monitor reads them like a real robot's force sensor.

The package follows lerobot's plugin layout (``config_mujoco_robot.py`` beside the robot,
which this package exports), so lerobot's own ``make_robot_from_config`` builds
``MujocoRobot`` from a ``MujocoRobotConfig`` as it builds any registered robot.

Requires the ``lerobot`` extra (``pip install rlpost-robot[lerobot]``).
"""

try:
    import lerobot.robots  # noqa: F401
except ImportError as exc:  # pragma: no cover - the default dev environment has lerobot
    from rlpost.core import MissingDependency

    raise MissingDependency(
        "rlpost.robot.lerobot_robot needs lerobot: pip install 'rlpost-robot[lerobot]'"
    ) from exc

from rlpost.robot.lerobot_robot.config_mujoco_robot import MujocoRobotConfig
from rlpost.robot.lerobot_robot.mujoco_robot import MujocoRobot, deploy

__all__ = ["MujocoRobot", "MujocoRobotConfig", "deploy"]
