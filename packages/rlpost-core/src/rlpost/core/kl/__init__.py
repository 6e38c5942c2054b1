"""KL estimators between the policy and a reference (the ``KL_ESTIMATORS`` registry).

=================  ===========================================================
module             entries
=================  ===========================================================
``estimators``     k1, k2, k3 (+ :func:`kl_reward_penalty` for in-reward use)
``reva``           reva_rer (REVA-PO's response-weighted KL, 004-09)
=================  ===========================================================
"""

from rlpost.core.kl import estimators, reva  # noqa: F401  (registration)
from rlpost.core.kl.base import KL_ESTIMATORS, KLInput, KLOutput, KLParams
from rlpost.core.kl.estimators import k1, k2, k3, kl_reward_penalty
from rlpost.core.kl.reva import ResponseWeightedKLParams, reva_response_weights

__all__ = [
    "KL_ESTIMATORS",
    "KLInput",
    "KLOutput",
    "KLParams",
    "ResponseWeightedKLParams",
    "k1",
    "k2",
    "k3",
    "kl_reward_penalty",
    "reva_response_weights",
]
