"""Preference optimisation of language models (``rlpost-llm dpo``): offline and online /
iterative training on the ``rlpost.core.preference`` losses (dpo, ipo, simpo, xi_dpo,
gate_dpo, ed_dpo).

==================  ===========================================================
module              what
==================  ===========================================================
``config``          :class:`PreferenceConfig`, :func:`load_preference_config`
``pairs``           task-built pairs (the embedded default), TRL-format files, token layout
``trainer``         :class:`PreferenceTrainer`, the curves plot and the summary
==================  ===========================================================
"""

from rlpost.llm.preference.config import PreferenceConfig, load_preference_config
from rlpost.llm.preference.pairs import PreferencePair, TokenPairs, perturb_answer
from rlpost.llm.preference.trainer import (
    PreferenceTrainer,
)

__all__ = [
    "PreferenceConfig",
    "PreferencePair",
    "PreferenceTrainer",
    "TokenPairs",
    "load_preference_config",
    "perturb_answer",
]
