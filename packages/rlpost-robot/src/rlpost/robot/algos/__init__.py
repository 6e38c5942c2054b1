"""Robot fine-tuning algorithms (the ``ALGORITHMS`` registry) and what they share.

=================  ===========================================================
module             contents
=================  ===========================================================
``base``           ALGORITHMS, Algorithm, RunContext, register_algorithm
``common``         chunk transitions, evaluation, force statistics, the online loop
``otql``           otql (004-16): flow policy, IQL chunk critic, OT flow matching
``pac_act``        pac_act (004-10): lerobot ACT, chunk actor-critic, safety prior
``craft``          craft (001-19): Gaussian chunk policy, counterfactual advantages
``lwd``            lwd (001-23): DIVL values + QAM flow policy extraction (fleet learner)
``residual``       the offline residual RL corrector (004-03; ``rlpost-robot residual``)
=================  ===========================================================

Importing this package registers every algorithm: each ``configuration_<name>`` module
(its config dataclass and registration; no torch) registers its own, and the runner in
``<name>`` is imported when a run starts.
"""

from rlpost.robot.algos import (  # noqa: F401  (each registers its algorithm; light)
    configuration_craft,
    configuration_lwd,
    configuration_otql,
    configuration_pac_act,
)
from rlpost.robot.algos.base import ALGORITHMS, Algorithm, RunContext, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "RunContext", "register_algorithm"]
