"""Advantage estimators (the ``ADVANTAGES`` registry): rewards, groups, masks and the
declared extra inputs -> per-response or per-token advantages.

=================  ===========================================================
module             entries
=================  ===========================================================
``classic``        grpo (and Dr. GRPO), rloo, reinforce_pp, gae
``shaping``        river, hmpo, icr, soft_pair_grpo, ed_grpo
``cross_prompt``   basis, gcpo
``best_of_n``      tea, prefix_tea
``entropy``        entrocraft, fade
``vector``         vpo, rdpo
``turns``          a2tgpo
``steps``          step_opsd
=================  ===========================================================

Importing this package registers every entry (each module registers its own).
"""

from rlpost.core.advantages import (  # noqa: F401  (each module registers its entries)
    best_of_n,
    classic,
    cross_prompt,
    entropy,
    shaping,
    stages,
    steps,
    turns,
    vector,
)
from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    TrainingDynamics,
    broadcast,
    group_normalize,
    last_token_index,
    response_rewards,
    reward_to_go,
    scalarize_rewards,
    token_reward_matrix,
)
from rlpost.core.advantages.classic import GAEParams, GRPOParams, ReinforcePPParams, grpo
from rlpost.core.advantages.cross_prompt import loo_ridge_values, semantic_disagreement

__all__ = [
    "ADVANTAGES",
    "AdvantageInput",
    "AdvantageOutput",
    "GAEParams",
    "GRPOParams",
    "ReinforcePPParams",
    "TrainingDynamics",
    "broadcast",
    "group_normalize",
    "grpo",
    "last_token_index",
    "loo_ridge_values",
    "response_rewards",
    "reward_to_go",
    "scalarize_rewards",
    "semantic_disagreement",
    "token_reward_matrix",
]
