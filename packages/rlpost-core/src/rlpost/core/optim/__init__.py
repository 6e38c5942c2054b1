"""Optimisers (the ``OPTIMIZERS`` registry) and the matrix optimisers behind them.

=================  ===========================================================
module             contents
=================  ===========================================================
``choices``        OPTIMIZERS: adamw, muon, pion
``matrix``         :class:`Muon`, :class:`Pion` (000-14) and their NS iterations
=================  ===========================================================
"""

from rlpost.core.optim import choices  # noqa: F401  (registration)
from rlpost.core.optim.base import OPTIMIZERS, OptimizerInput
from rlpost.core.optim.matrix import (
    Muon,
    Pion,
    muon_orthogonalize,
    pion_cut,
    pion_filter,
    spectral_norm_estimate,
)

__all__ = [
    "OPTIMIZERS",
    "Muon",
    "OptimizerInput",
    "Pion",
    "muon_orthogonalize",
    "pion_cut",
    "pion_filter",
    "spectral_norm_estimate",
]
