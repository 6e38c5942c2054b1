"""rlpost.robot: RL post-training of robot policies on MuJoCo / gymnasium."""

import ctypes.util
import os
import sys

__version__ = "0.1.0"


def _default_gl_backend() -> None:
    """Headless Linux: pick EGL for MuJoCo rendering unless the user chose a backend.

    MuJoCo reads ``MUJOCO_GL`` once, when it is first imported, so this runs when the
    package is imported, before any submodule imports mujoco; it does nothing with a
    display, without libEGL, or when mujoco was imported already.
    """
    if (
        "MUJOCO_GL" not in os.environ
        and sys.platform.startswith("linux")
        and not os.environ.get("DISPLAY")
        and "mujoco" not in sys.modules
        and ctypes.util.find_library("EGL")
    ):
        os.environ["MUJOCO_GL"] = "egl"


_default_gl_backend()

#: Distributions this domain builds on; ``rlpost-robot doctor`` prints their versions.
ENGINES = ["gymnasium", "mujoco", "lerobot"]


def environment_report() -> dict[str, str]:
    """Installed version of every engine this domain uses (or 'not installed')."""
    from rlpost.core._env import versions  # lazy: worker processes import this package cheaply

    return versions(["torch", *ENGINES])
