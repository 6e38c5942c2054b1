"""rlpost.robot: RL post-training of robot policies on MuJoCo / gymnasium."""

__version__ = "0.1.0"

#: Distributions this domain builds on; ``rlpost-robot doctor`` prints their versions.
ENGINES = ["gymnasium", "mujoco", "ray", "lerobot"]


def environment_report() -> dict[str, str]:
    """Installed version of every engine this domain uses (or 'not installed')."""
    from rlpost.core._env import versions  # lazy: worker processes import this package cheaply

    return versions(["torch", *ENGINES])
