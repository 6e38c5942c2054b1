"""Diffusion / flow-matching post-training methods (the ``METHODS`` registry).

=================  ===========================================================
module             methods
=================  ===========================================================
``sde``            flow_grpo, dance_grpo, slas (SDE replay: PPO clip per step)
``velocity``       ram, awm, rwr (ODE endpoints re-noised: velocity regression)
=================  ===========================================================
"""

from rlpost.diffusion.methods import sde, velocity  # noqa: F401  (registration)
from rlpost.diffusion.methods.base import (
    METHODS,
    NEEDS,
    BoundMethod,
    LossInput,
    LossOutput,
    Method,
    register_method,
)

__all__ = [
    "METHODS",
    "NEEDS",
    "BoundMethod",
    "LossInput",
    "LossOutput",
    "Method",
    "register_method",
]
