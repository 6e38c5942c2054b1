"""rlpost.core: the shared RL post-training math (torch + numpy only).

One registry per independent choice; entries share a frozen-dataclass input type.

========================  =====================================  ===========================
registry                  input -> output                        module
========================  =====================================  ===========================
``ADVANTAGES``            AdvantageInput -> AdvantageOutput      :mod:`rlpost.core.advantages`
``RATIOS``                RatioInput -> RatioOutput              :mod:`rlpost.core.ratios`
``CORRECTIONS``           RatioInput -> CorrectionOutput         :mod:`rlpost.core.ratios`
``OBJECTIVES``            ObjectiveInput -> ObjectiveOutput      :mod:`rlpost.core.objectives`
``AGGREGATIONS``          AggregationInput -> AggregationOutput  :mod:`rlpost.core.aggregation`
``KL_ESTIMATORS``         KLInput -> KLOutput                    :mod:`rlpost.core.kl`
``PREFERENCE_LOSSES``     PreferenceInput -> PreferenceOutput    :mod:`rlpost.core.preference`
========================  =====================================  ===========================

Presets (:mod:`rlpost.core.presets`) combine entries with a paper's hyper-parameters.
"""

from rlpost.core import (  # noqa: F401  (importing registers their entries and presets)
    best_of_n,
    divergence,
    entropy_shaping,
    group_objectives,
    multi_reward,
    offpolicy,
    ratio_presets,
    regularizers,
)
from rlpost.core.advantages import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    TrainingDynamics,
)
from rlpost.core.aggregation import AGGREGATIONS, AggregationInput, AggregationOutput
from rlpost.core.kl import KL_ESTIMATORS, KLInput, KLOutput, kl_reward_penalty
from rlpost.core.logprobs import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits
from rlpost.core.masked import (
    group_stats,
    group_sum,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from rlpost.core.objectives import OBJECTIVES, ObjectiveInput, ObjectiveOutput
from rlpost.core.preference import PREFERENCE_LOSSES, PreferenceInput, PreferenceOutput
from rlpost.core.presets import (
    PRESETS,
    Choice,
    PolicyLoss,
    Preset,
    Recipe,
    get_preset,
    register_preset,
)
from rlpost.core.ratios import CORRECTIONS, RATIOS, CorrectionOutput, RatioInput, RatioOutput
from rlpost.core.registry import Bound, NoParams, Registry, RegistryError
from rlpost.core.turns import A2TGPOParams  # importing it registers a2tgpo + its preset
from rlpost.core.weights import (
    AnchorExplorerMasks,
    TokenSubset,
    anchor_explorer_masks,
    attention_entropy,
    dynamic_entropy_weights,
    random_token_subset,
)

__version__ = "0.1.0"

REGISTRIES = {
    "advantage": ADVANTAGES,
    "ratio": RATIOS,
    "correction": CORRECTIONS,
    "objective": OBJECTIVES,
    "aggregation": AGGREGATIONS,
    "kl": KL_ESTIMATORS,
    "preference": PREFERENCE_LOSSES,
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "PREFERENCE_LOSSES",
    "PRESETS",
    "RATIOS",
    "REGISTRIES",
    "A2TGPOParams",
    "AdvantageInput",
    "AdvantageOutput",
    "AggregationInput",
    "AggregationOutput",
    "AnchorExplorerMasks",
    "Bound",
    "Choice",
    "CorrectionOutput",
    "KLInput",
    "KLOutput",
    "NoParams",
    "ObjectiveInput",
    "ObjectiveOutput",
    "PolicyLoss",
    "PreferenceInput",
    "PreferenceOutput",
    "Preset",
    "RatioInput",
    "RatioOutput",
    "Recipe",
    "Registry",
    "RegistryError",
    "TokenSubset",
    "TrainingDynamics",
    "anchor_explorer_masks",
    "attention_entropy",
    "dynamic_entropy_weights",
    "entropy_from_logits",
    "get_preset",
    "group_stats",
    "group_sum",
    "kl_reward_penalty",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "random_token_subset",
    "register_preset",
]
