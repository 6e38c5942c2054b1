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

Importing this package registers every algorithm (each module registers its own).
"""

from rlpost.robot.algos import craft, lwd, otql, pac_act  # noqa: F401  (registration)
from rlpost.robot.algos.base import ALGORITHMS, Algorithm, RunContext, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "RunContext", "register_algorithm"]
