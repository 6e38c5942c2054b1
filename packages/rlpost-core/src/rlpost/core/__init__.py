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

The names below are imported on first use (``__getattr__``): ``import rlpost.core``
and its light modules (``registry``, ``contract``, ``io``) import no torch, so a domain's
configuration can be validated without it.
"""

import importlib
from typing import Any

_LAZY = {  # name -> the submodule it lives in (imported on first use: PEP 562)
    "MissingDependency": "rlpost.core._env",
    "pick_device": "rlpost.core._env",
    "ADVANTAGES": "rlpost.core.advantages",
    "AdvantageInput": "rlpost.core.advantages",
    "AdvantageOutput": "rlpost.core.advantages",
    "TrainingDynamics": "rlpost.core.advantages",
    "A2TGPOParams": "rlpost.core.advantages.turns",
    "AGGREGATIONS": "rlpost.core.aggregation",
    "AggregationInput": "rlpost.core.aggregation",
    "AggregationOutput": "rlpost.core.aggregation",
    "ContractError": "rlpost.core.contract",
    "Coupling": "rlpost.core.contract",
    "Input": "rlpost.core.contract",
    "DISTILL_ESTIMATORS": "rlpost.core.distill",
    "DistillInput": "rlpost.core.distill",
    "DistillOutput": "rlpost.core.distill",
    "DistillSchedule": "rlpost.core.distill",
    "TeacherDistributions": "rlpost.core.distill",
    "KL_ESTIMATORS": "rlpost.core.kl",
    "KLInput": "rlpost.core.kl",
    "KLOutput": "rlpost.core.kl",
    "kl_reward_penalty": "rlpost.core.kl",
    "entropy_from_logits": "rlpost.core.logprobs",
    "logprobs_and_entropy": "rlpost.core.logprobs",
    "logprobs_from_logits": "rlpost.core.logprobs",
    "group_stats": "rlpost.core.masked",
    "group_sum": "rlpost.core.masked",
    "masked_mean": "rlpost.core.masked",
    "masked_sum": "rlpost.core.masked",
    "masked_var": "rlpost.core.masked",
    "masked_whiten": "rlpost.core.masked",
    "OBJECTIVES": "rlpost.core.objectives",
    "ObjectiveInput": "rlpost.core.objectives",
    "ObjectiveOutput": "rlpost.core.objectives",
    "OPTIMIZERS": "rlpost.core.optim",
    "OptimizerInput": "rlpost.core.optim",
    "PREFERENCE_LOSSES": "rlpost.core.preference",
    "PreferenceInput": "rlpost.core.preference",
    "PreferenceOutput": "rlpost.core.preference",
    "PRESETS": "rlpost.core.presets",
    "Choice": "rlpost.core.presets",
    "PolicyBatch": "rlpost.core.presets",
    "PolicyLoss": "rlpost.core.presets",
    "Preset": "rlpost.core.presets",
    "Recipe": "rlpost.core.presets",
    "get_preset": "rlpost.core.presets",
    "register_preset": "rlpost.core.presets",
    "CORRECTIONS": "rlpost.core.ratios",
    "RATIOS": "rlpost.core.ratios",
    "CorrectionOutput": "rlpost.core.ratios",
    "RatioInput": "rlpost.core.ratios",
    "RatioOutput": "rlpost.core.ratios",
    "TokenDistributions": "rlpost.core.ratios",
    "Bound": "rlpost.core.registry",
    "NoParams": "rlpost.core.registry",
    "Registry": "rlpost.core.registry",
    "RegistryError": "rlpost.core.registry",
    "REGULARIZERS": "rlpost.core.regularizers",
    "GradientInput": "rlpost.core.regularizers",
    "GradientOutput": "rlpost.core.regularizers",
    "TOKEN_WEIGHTINGS": "rlpost.core.weights",
    "AnchorExplorerMasks": "rlpost.core.weights",
    "TokenSubset": "rlpost.core.weights",
    "anchor_explorer_masks": "rlpost.core.weights",
    "attention_entropy": "rlpost.core.weights",
    "dynamic_entropy_weights": "rlpost.core.weights",
    "random_token_subset": "rlpost.core.weights",
}

_REGISTRIES = {  # kind -> the registry's name in _LAZY
    "advantage": "ADVANTAGES",
    "ratio": "RATIOS",
    "correction": "CORRECTIONS",
    "objective": "OBJECTIVES",
    "aggregation": "AGGREGATIONS",
    "kl": "KL_ESTIMATORS",
    "distill": "DISTILL_ESTIMATORS",
    "preference": "PREFERENCE_LOSSES",
    "optimizer": "OPTIMIZERS",
    "regularizer": "REGULARIZERS",
    "token_weighting": "TOKEN_WEIGHTINGS",
}

__version__ = "0.1.0"


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


def __getattr__(name: str) -> Any:
    """Import the submodule holding ``name`` on first use, so that ``import rlpost.core``
    (and a light module under it: ``registry``, ``contract``, ``io.schema``) does not
    import torch; every public name resolves as before."""
    if name == "REGISTRIES":
        value: Any = {k: __getattr__(v) for k, v in _REGISTRIES.items()}
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:  # a submodule (``rlpost.core.presets``), as an attribute before its import
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'rlpost.core' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
