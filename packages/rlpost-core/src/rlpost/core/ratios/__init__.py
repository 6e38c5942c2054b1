"""Policy ratios (``RATIOS``) and rollout-engine importance corrections (``CORRECTIONS``).

Two registries, because a recipe chooses them independently (GSPO's sequence ratio is
routinely combined with a truncated-IS rollout correction); they share the input
:class:`RatioInput`.

=================  ===========================================================
module             entries
=================  ===========================================================
``policy``         RATIOS: token, sequence, cumulative
``corrections``    CORRECTIONS: none, tis, mis, ftis, sis, clipped_is
``divergence``     CORRECTIONS: predictive_divergence_mask (+ its functional API)
=================  ===========================================================
"""

from rlpost.core.ratios import corrections, divergence, policy  # noqa: F401  (registration)
from rlpost.core.ratios.base import (
    CORRECTIONS,
    RATIOS,
    CorrectionOutput,
    RatioInput,
    RatioOutput,
    TokenDistributions,
)

__all__ = [
    "CORRECTIONS",
    "RATIOS",
    "CorrectionOutput",
    "RatioInput",
    "RatioOutput",
    "TokenDistributions",
]
