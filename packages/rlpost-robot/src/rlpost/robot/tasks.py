"""The robot tasks' static descriptions (:data:`TASKS`): light (dataclasses and math only),
so that a config validates a task name without importing gymnasium or MuJoCo. The
environments themselves are in :mod:`rlpost.robot.envs`, which re-exports these names."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

__all__ = ["CONTOUR", "MULTIMODAL", "PIXELS", "PUSHER_JOINTS", "TASKS", "TaskSpec"]


@dataclass(frozen=True)
class TaskSpec:
    """Static description of a task.

    ``fps``: control rate (1 / control step). ``success_threshold``: the ``distance``
    (metres) under which the task counts as solved. ``force_threshold``: contact force
    (Newtons) above which a step counts as unsafe (``None`` without force).
    ``obs_names`` / ``act_names`` label the observation and action entries the way a
    lerobot robot names its features (``{motor}.pos``, ``{motor}.vel``, ``{motor}.effort``
    after what the motor is commanded in; a LeRobotDataset's ``names``), so data and
    robots are matched to the task by name (:mod:`rlpost.robot.features`); ``env_obs``
    indexes the entries that describe the world (targets, objects, goals) rather than the
    robot (what lerobot calls ``observation.environment_state``). ``terminates_on_success``: the episode ends as soon
    as it succeeds (else only at ``max_steps``).
    """

    name: str
    obs_dim: int
    act_dim: int
    max_steps: int
    fps: float
    success_threshold: float
    has_force: bool
    force_threshold: float | None
    terminates_on_success: bool = False
    obs_names: tuple[str, ...] = field(default=(), repr=False)
    act_names: tuple[str, ...] = field(default=(), repr=False)
    env_obs: tuple[int, ...] = field(default=(), repr=False)
    description: str = field(default="", repr=False)
    image_shape: tuple[int, int, int] | None = None
    """``(H, W, C)`` of the camera image appended (flattened, 0-255) to the state."""
    base: str | None = field(default=None, repr=False)
    """For an image variant: the state task it renders (same dynamics and experts)."""


def _xyz(prefix: str, suffix: str = "") -> tuple[str, ...]:
    """``prefix.x`` ... (or ``x.suffix`` ... without a prefix)."""
    return tuple(f"{prefix}.{c}" if prefix else f"{c}.{suffix}" for c in "xyz")


#: the joints of gymnasium's Pusher-v5 arm, in its action order
PUSHER_JOINTS = (
    *("r_shoulder_pan", "r_shoulder_lift", "r_upper_arm_roll", "r_elbow_flex"),
    *("r_forearm_roll", "r_wrist_flex", "r_wrist_roll"),
)


@dataclass(frozen=True)
class _MultimodalConst:
    goal_radius: float = 0.4  # distance of each goal from the start (m)
    goal_angle: float = math.pi / 4  # goal 0 direction ~ U(-goal_angle, goal_angle)
    start_noise: float = 0.05  # start ~ U(-start_noise, start_noise)^2 (m)
    success_radius: float = 0.05  # (m)
    frame_skip: int = 4  # x 0.01 s physics step = 0.04 s control step


@dataclass(frozen=True)
class _ContourConst:
    cyl_radius: float = 0.25  # surface: cylinder of this radius, axis along y through 0
    eff_radius: float = 0.015  # effector sphere radius
    arc_a: tuple[float, float] = (-0.65, -0.5)  # angle of A from the vertical ~ U(range)
    arc_b: tuple[float, float] = (0.5, 0.65)  # angle of B
    y_range: float = 0.06  # y of A and B ~ U(-y_range, y_range)
    hover: float = 0.05  # start this far above A, along the surface normal (m)
    nominal_force: float = 5.0  # N
    force_threshold: float = 8.0  # N (60 % above nominal)
    contact_min_force: float = 0.5  # N: "in contact"
    no_contact_penalty: float = 0.3  # per control step without contact
    checkpoint_bonus: float = 0.25  # per newly visited checkpoint
    success_bonus: float = 1.0
    success_radius: float = 0.02  # m
    n_checkpoints: int = 4  # evenly spaced on the arc strictly between A and B
    checkpoint_radius: float = 0.03  # m: a checkpoint is visited within this, in contact
    kp: float = 400.0  # servo stiffness (N/m), as in the XML
    frame_skip: int = 10  # x 0.004 s physics step = 0.04 s control step

    @property
    def contact_radius(self) -> float:
        """Distance of the effector centre from the cylinder axis when just touching."""
        return self.cyl_radius + self.eff_radius


MULTIMODAL = _MultimodalConst()
CONTOUR = _ContourConst()


# ------------------------------------------------------------------ registry


TASKS: dict[str, TaskSpec] = {
    "reacher": TaskSpec(
        name="reacher",
        obs_dim=10,
        act_dim=2,
        max_steps=50,
        fps=50.0,
        success_threshold=0.02,
        has_force=False,
        force_threshold=None,
        obs_names=(
            *("shoulder.cos", "elbow.cos", "shoulder.sin", "elbow.sin", "target.x", "target.y"),
            *("shoulder.vel", "elbow.vel", "tip_to_target.x", "tip_to_target.y"),
        ),
        act_names=("shoulder.effort", "elbow.effort"),
        env_obs=(4, 5, 8, 9),
        description="gymnasium Reacher-v5; success: fingertip-target distance < 0.02 m",
    ),
    "pusher": TaskSpec(
        name="pusher",
        obs_dim=23,
        act_dim=7,
        max_steps=100,
        fps=20.0,
        success_threshold=0.08,
        has_force=False,
        force_threshold=None,
        obs_names=(
            *(f"{j}.pos" for j in PUSHER_JOINTS),
            *(f"{j}.vel" for j in PUSHER_JOINTS),
            *_xyz("tip"),
            *_xyz("object"),
            *_xyz("goal"),
        ),
        act_names=tuple(f"{j}.effort" for j in PUSHER_JOINTS),
        env_obs=tuple(range(17, 23)),
        description="gymnasium Pusher-v5; success: object-goal xy distance < 0.08 m",
    ),
    "multimodal_reach": TaskSpec(
        name="multimodal_reach",
        obs_dim=8,
        act_dim=2,
        max_steps=50,
        fps=25.0,
        success_threshold=MULTIMODAL.success_radius,
        has_force=False,
        force_threshold=None,
        terminates_on_success=True,
        obs_names=("x.pos", "y.pos", "x.vel", "y.vel", "goal0.x", "goal0.y", "goal1.x", "goal1.y"),
        act_names=("x.vel", "y.vel"),  # velocity servos, as a mobile base's ``x.vel``
        env_obs=(4, 5, 6, 7),
        description="point mass must reach either of two opposite goals (bimodal demos)",
    ),
    "contour": TaskSpec(
        name="contour",
        obs_dim=11,
        act_dim=3,
        max_steps=100,
        fps=25.0,
        success_threshold=CONTOUR.success_radius,
        has_force=True,
        force_threshold=CONTOUR.force_threshold,
        terminates_on_success=True,
        obs_names=(*_xyz("", "pos"), *_xyz("", "vel"), "contact_force", *_xyz("b"), "progress"),
        act_names=_xyz("", "pos"),  # position servos on the x / y / z slides, as an arm's
        env_obs=(7, 8, 9, 10),
        description="press on a curved rigid surface and slide from A to B (force-safety)",
    ),
}

#: side of the square camera image of the ``*_pixels`` tasks
PIXELS = 32


def _pixel_variant(base: str) -> TaskSpec:
    b = TASKS[base]
    shape = (PIXELS, PIXELS, 3)
    return dataclasses.replace(
        b,
        name=f"{base}_pixels",
        obs_dim=b.obs_dim + PIXELS * PIXELS * 3,
        obs_names=(*b.obs_names, *(f"front.{i}" for i in range(PIXELS * PIXELS * 3))),
        description=f"{b.description}; plus a {PIXELS}x{PIXELS} RGB camera image",
        image_shape=shape,
        base=base,
    )


TASKS["multimodal_reach_pixels"] = _pixel_variant("multimodal_reach")
