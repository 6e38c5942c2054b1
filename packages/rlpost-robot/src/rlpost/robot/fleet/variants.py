"""A heterogeneous fleet: robots that differ in dynamics and in task variant.

A :class:`RobotVariant` changes one simulated robot: its MuJoCo model (body masses, joint
damping, the actuators' command gain and servo stiffness, an in-plane force such as a
sloped floor), its actuators' noise, and the task's own parameters (on
``multimodal_reach``: how far the goals are, ``goal_radius``; over which angles,
``goal_angle``). Robot ``i`` of a fleet takes variant ``i mod len(variants)``.

:data:`DEFAULT_VARIANTS` is the fleet the ``fleet`` recipes use: eight robots of which
only the first matches the demonstrations' robot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DEFAULT_VARIANTS", "RobotVariant", "apply_variant"]


@dataclass(frozen=True)
class RobotVariant:
    """How one robot differs from the task's nominal one (1.0 / 0.0 / empty: unchanged)."""

    name: str = "nominal"
    mass: float = 1.0
    """Scale of every body's mass."""
    damping: float = 1.0
    """Scale of every joint's damping."""
    gain: float = 1.0
    """Scale of the actuators' command gain alone: a servo that reaches ``gain`` times the
    commanded velocity or position offset (a miscalibrated or worn actuator)."""
    stiffness: float = 1.0
    """Scale of the servos' stiffness (gain and feedback together)."""
    tilt: tuple[float, float] = (0.0, 0.0)
    """In-plane gravity (m/s^2, x and y): a sloped floor pushing the robot one way."""
    action_noise: float = 0.0
    """Standard deviation of Gaussian noise added to each normalised action."""
    task: dict[str, Any] = field(default_factory=dict)
    """Task parameters replaced (``multimodal_reach``: ``goal_radius``, ``goal_angle``,
    ``start_noise``)."""

    def __post_init__(self) -> None:
        for name in ("mass", "damping", "gain", "stiffness"):
            if not getattr(self, name) > 0:
                raise ValueError(f"variant {self.name!r}: {name} must be > 0")
        if self.action_noise < 0:
            raise ValueError(f"variant {self.name!r}: action_noise must be >= 0")
        object.__setattr__(self, "tilt", tuple(float(t) for t in self.tilt))
        if len(self.tilt) != 2:
            raise ValueError(f"variant {self.name!r}: tilt is (x, y), got {self.tilt}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RobotVariant:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"robot variant: unknown fields {unknown}; known: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tilt"] = list(self.tilt)
        return d


def apply_variant(env: Any, variant: RobotVariant) -> None:
    """Change the MuJoCo model (and task constants) of ``env`` (a
    :class:`rlpost.robot.envs.TaskEnv`) in place; call before its first reset."""
    native = env.unwrapped
    m = native.model
    m.body_mass[:] = m.body_mass * variant.mass
    m.body_inertia[:] = m.body_inertia * variant.mass
    m.dof_damping[:] = m.dof_damping * variant.damping
    # lerobot-style servos: force = gainprm[0] ctrl + biasprm[1] q + biasprm[2] qdot
    m.actuator_gainprm[:, 0] = m.actuator_gainprm[:, 0] * variant.gain * variant.stiffness
    m.actuator_biasprm[:, 1:3] = m.actuator_biasprm[:, 1:3] * variant.stiffness
    if any(variant.tilt):
        m.opt.gravity[:2] = np.asarray(variant.tilt)
    if variant.task:
        const = getattr(native, "const", None)
        if const is None:
            raise ValueError(
                f"variant {variant.name!r}: task {env.task_spec.name} has no task parameters "
                f"to vary (task: {sorted(variant.task)})"
            )
        try:
            native.const = dataclasses.replace(const, **variant.task)
        except TypeError as exc:
            names = sorted(f.name for f in dataclasses.fields(const))
            raise ValueError(f"variant {variant.name!r}: task parameters are {names}") from exc


#: the fleet the ``fleet`` recipes use (robot ``i`` takes variant ``i mod 8``)
DEFAULT_VARIANTS: tuple[RobotVariant, ...] = (
    RobotVariant("nominal"),
    RobotVariant("weak-servo", gain=0.6),
    RobotVariant("strong-servo", gain=1.4),
    RobotVariant("heavy", mass=3.0, stiffness=0.7),
    RobotVariant("slope", tilt=(0.0, 1.5)),
    RobotVariant("far-goals", task={"goal_radius": 0.5}),
    RobotVariant("noisy", action_noise=0.3),
    RobotVariant("near-goals-damped", damping=6.0, task={"goal_radius": 0.3}),
)
