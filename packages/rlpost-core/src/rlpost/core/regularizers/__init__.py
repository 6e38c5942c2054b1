"""Gradient regularisers (the ``REGULARIZERS`` registry): transforms of a step's gradient
that use an auxiliary data set, the parameters or a sequence of tasks.

=================  ===========================================================
module             entries (and the stateful helpers behind them)
=================  ===========================================================
``gac``            gac: SFT/RL mixing (000-06; :class:`GACController`)
``dr``             dr_post_training: projection onto general-data feasible sets
                   (001-12; :func:`dr_project`)
``cpo``            cpo: movement-Fisher drift penalty across tasks (004-18;
                   :class:`CPORegularizer`, :func:`movement_fisher`)
=================  ===========================================================

REVA-PO's response-weighted KL is a KL estimator: :mod:`rlpost.core.kl.reva`.
"""

from rlpost.core.regularizers import cpo, dr, gac  # noqa: F401  (registration)
from rlpost.core.regularizers.base import (
    REGULARIZERS,
    GradientInput,
    GradientOutput,
    flat_grad,
    set_flat_grad_,
)
from rlpost.core.regularizers.cpo import CPOParams, CPORegularizer, movement_fisher
from rlpost.core.regularizers.dr import DrParams, apply_dr_projection_, dr_project
from rlpost.core.regularizers.gac import GACController, GACParams, GACSignals, gac_signals

__all__ = [
    "REGULARIZERS",
    "CPOParams",
    "CPORegularizer",
    "DrParams",
    "GACController",
    "GACParams",
    "GACSignals",
    "GradientInput",
    "GradientOutput",
    "apply_dr_projection_",
    "dr_project",
    "flat_grad",
    "gac_signals",
    "movement_fisher",
    "set_flat_grad_",
]
