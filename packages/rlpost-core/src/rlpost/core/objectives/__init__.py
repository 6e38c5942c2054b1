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

#: The objectives linear in the advantage: a row whose advantages are all 0 has loss and
#: gradient exactly 0 at any policy, on- or off-policy (the contract test checks it
#: off-policy with every advantage 0; a group-coupled entry here reads no zero row). A trainer may leave such rows out of the forward
#: and backward when nothing else in the loss reads them (no KL term, entropy bonus or
#: distillation). Not here: ``hard_pair_grpo`` (fits the ratio to a target of 0),
#: ``implicit_pessimism`` and ``lpo`` (pull towards the old policy), ``ess_adaptive``
#: (a batch statistic).
INERT_AT_ZERO_ADVANTAGE = frozenset(
    {
        "ppo_clip", "ppo_clip_turn", "cispo", "reinforce", "ctpo_clip", "is_pg",
        "mu_grpo", "conspo", "up", "ripo", "sao",
    }
)  # fmt: skip

__all__ = [
    "INERT_AT_ZERO_ADVANTAGE",
    "OBJECTIVES",
    "ObjectiveInput",
    "ObjectiveOutput",
    "PPOClipParams",
    "broadcast_advantages",
    "clipped_surrogate",
    "ppo_clip",
]
