"""Policy objectives (the ``OBJECTIVES`` registry): per-token loss matrices with detached
diagnostics, ``fn(ObjectiveInput, params) -> ObjectiveOutput``.

=================  ===========================================================
module             entries
=================  ===========================================================
``clipped``        ppo_clip, cispo, reinforce, ppo_clip_turn, ctpo_clip,
                   hard_pair_grpo, is_pg
``group``          mu_grpo, conspo, lpo (group-coupled)
``offpolicy``      implicit_pessimism, ess_adaptive (batch-coupled), up, ripo, sao
=================  ===========================================================
"""

from rlpost.core.objectives import clipped, group, offpolicy  # noqa: F401  (registration)
from rlpost.core.objectives.base import (
    OBJECTIVES,
    ObjectiveInput,
    ObjectiveOutput,
    broadcast_advantages,
    clipped_surrogate,
)
from rlpost.core.objectives.clipped import PPOClipParams, ppo_clip

__all__ = [
    "OBJECTIVES",
    "ObjectiveInput",
    "ObjectiveOutput",
    "PPOClipParams",
    "broadcast_advantages",
    "clipped_surrogate",
    "ppo_clip",
]
