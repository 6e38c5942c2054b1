"""lerobot config of :class:`~rlpost.robot.lerobot_robot.MujocoRobot` (type ``rlpost_mujoco``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.robots import RobotConfig


@RobotConfig.register_subclass("rlpost_mujoco")
@dataclass
class MujocoRobotConfig(RobotConfig):
    """``task``: a key of :data:`rlpost.robot.envs.TASKS`. lerobot's base config adds
    ``id`` and ``calibration_dir`` (the base class creates that folder even though a
    simulated robot has nothing to calibrate; pass a ``Path`` in tests). ``rename``: the
    robot's own names for the task's features (``{"x.pos": "shoulder_pan.pos", ...}``),
    to stand in for an arm whose features are named otherwise. ``variant``: how this
    robot differs from the nominal one (:class:`rlpost.robot.fleet.variants.RobotVariant`
    fields: masses, damping, servo gain, a slope, actuator noise, task parameters), as
    the robots of a fleet do."""

    task: str = "reacher"
    seed: int = 0
    rename: dict[str, str] = field(default_factory=dict)
    variant: dict = field(default_factory=dict)
