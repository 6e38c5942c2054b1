"""Training families of the diffusion trainer (the ``FAMILIES`` registry): how a sampled
batch becomes a method's loss inputs.

=================  ===========================================================
module             family
=================  ===========================================================
``sde_replay``     sde_replay: stored SDE transitions replayed with ratios
``renoise``        renoise: ODE endpoints re-noised, velocity regression
=================  ===========================================================

Importing this package registers every family (each module registers its own).
"""

from rlpost.diffusion.families import renoise, sde_replay  # noqa: F401  (registration)
from rlpost.diffusion.families.base import FAMILIES, Family, Plan, register_family

__all__ = ["FAMILIES", "Family", "Plan", "register_family"]
