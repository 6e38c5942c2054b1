"""Samplers of rectified-flow models (the ``SAMPLERS`` registry).

=================  ===========================================================
module             sampler
=================  ===========================================================
``ode``            ode: the deterministic Euler step (no log-probability)
``flow_grpo``      flow_grpo: SDE, s = a sqrt(sigma / (1 - sigma))
``dance``          dance: SDE, constant s = eta
=================  ===========================================================

Importing this package registers every sampler (each module registers its own).
"""

from rlpost.diffusion.samplers import dance, flow_grpo, ode  # noqa: F401  (registration)
from rlpost.diffusion.samplers.base import (
    SAMPLERS,
    Sampler,
    StepContext,
    Trajectory,
    register_sampler,
    sample,
    step,
)

__all__ = [
    "SAMPLERS",
    "Sampler",
    "StepContext",
    "Trajectory",
    "register_sampler",
    "sample",
    "step",
]
