"""rlpost.core: the shared RL post-training math (torch + numpy only).

One registry per independent choice, one subpackage per registry; entries share a
frozen-dataclass input type and declare their side of the method/trainer contract
(:mod:`rlpost.core.contract`) where they are registered.

========================  =====================================  ===========================
registry                  input -> output                        subpackage
========================  =====================================  ===========================
``ADVANTAGES``            AdvantageInput -> AdvantageOutput      :mod:`rlpost.core.advantages`
``RATIOS``                RatioInput -> RatioOutput              :mod:`rlpost.core.ratios`
``CORRECTIONS``           RatioInput -> CorrectionOutput         :mod:`rlpost.core.ratios`
``OBJECTIVES``            ObjectiveInput -> ObjectiveOutput      :mod:`rlpost.core.objectives`
``AGGREGATIONS``          AggregationInput -> AggregationOutput  :mod:`rlpost.core.aggregation`
``KL_ESTIMATORS``         KLInput -> KLOutput                    :mod:`rlpost.core.kl`
``DISTILL_ESTIMATORS``    DistillInput -> DistillOutput          :mod:`rlpost.core.distill`
``PREFERENCE_LOSSES``     PreferenceInput -> PreferenceOutput    :mod:`rlpost.core.preference`
``OPTIMIZERS``            OptimizerInput -> torch Optimizer      :mod:`rlpost.core.optim`
``REGULARIZERS``          GradientInput -> GradientOutput        :mod:`rlpost.core.regularizers`
``TOKEN_WEIGHTINGS``      TokenWeightInput -> TokenWeightOutput  :mod:`rlpost.core.weights`
========================  =====================================  ===========================

Presets (:mod:`rlpost.core.presets`, one module per family) combine entries with a
paper's hyper-parameters; ``Preset.build()`` gives the :class:`Recipe` a trainer calls.
"""

from rlpost.core._env import MissingDependency, pick_device
from rlpost.core.advantages import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    TrainingDynamics,
)
from rlpost.core.advantages.turns import A2TGPOParams
from rlpost.core.aggregation import AGGREGATIONS, AggregationInput, AggregationOutput
from rlpost.core.contract import ContractError, Coupling, Input
from rlpost.core.distill import (
    DISTILL_ESTIMATORS,
    DistillInput,
    DistillOutput,
    DistillSchedule,
    TeacherDistributions,
)
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
from rlpost.core.optim import OPTIMIZERS, OptimizerInput
from rlpost.core.preference import PREFERENCE_LOSSES, PreferenceInput, PreferenceOutput
from rlpost.core.presets import (
    PRESETS,
    Choice,
    PolicyBatch,
    PolicyLoss,
    Preset,
    Recipe,
    get_preset,
    register_preset,
)
from rlpost.core.ratios import (
    CORRECTIONS,
    RATIOS,
    CorrectionOutput,
    RatioInput,
    RatioOutput,
    TokenDistributions,
)
from rlpost.core.registry import Bound, NoParams, Registry, RegistryError
from rlpost.core.regularizers import REGULARIZERS, GradientInput, GradientOutput
from rlpost.core.weights import (
    TOKEN_WEIGHTINGS,
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
    "distill": DISTILL_ESTIMATORS,
    "preference": PREFERENCE_LOSSES,
    "optimizer": OPTIMIZERS,
    "regularizer": REGULARIZERS,
    "token_weighting": TOKEN_WEIGHTINGS,
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTIONS",
    "DISTILL_ESTIMATORS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "OPTIMIZERS",
    "PREFERENCE_LOSSES",
    "PRESETS",
    "RATIOS",
    "REGISTRIES",
    "REGULARIZERS",
    "TOKEN_WEIGHTINGS",
    "A2TGPOParams",
    "AdvantageInput",
    "AdvantageOutput",
    "AggregationInput",
    "AggregationOutput",
    "AnchorExplorerMasks",
    "Bound",
    "Choice",
    "ContractError",
    "CorrectionOutput",
    "Coupling",
    "DistillInput",
    "DistillOutput",
    "DistillSchedule",
    "GradientInput",
    "GradientOutput",
    "Input",
    "KLInput",
    "KLOutput",
    "MissingDependency",
    "NoParams",
    "ObjectiveInput",
    "ObjectiveOutput",
    "OptimizerInput",
    "PolicyBatch",
    "PolicyLoss",
    "PreferenceInput",
    "PreferenceOutput",
    "Preset",
    "RatioInput",
    "RatioOutput",
    "Recipe",
    "Registry",
    "RegistryError",
    "TeacherDistributions",
    "TokenDistributions",
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
    "pick_device",
    "random_token_subset",
    "register_preset",
]
