"""Presets (``PRESETS``): a paper's recipe as one entry per registry plus its hyper-parameters.

=================  ===========================================================
module             presets
=================  ===========================================================
``standard``       grpo, dapo, dr_grpo, gspo, rloo, reinforce_pp, ppo
``advantages``     river, hmpo, icr, soft_pair_grpo, basis, gcpo, ed_grpo, tea,
                   prefix_tea, entrocraft, fade, vpo, rdpo, a2tgpo, step_opsd,
                   rubricem
``ratios``         ftis, ctpo, sis, ring_zero, predictive_divergence_mask
``objectives``     hard_pair_grpo, implicit_pessimism, ess_adaptive, up, up_gspo,
                   ripo, sao, mu_grpo, conspo, lpo
``regularized``    reva_po
``distill``        opd, opd_rl, mopd, copd, atod, opsd, sdpo, resd, pmd, sd_search
``mutual``         prp, xgrpo, sgt
``exploration``    fbos, fbos_epa, fbos_ecc, rubricem_reflect, rubricem_episodes
=================  ===========================================================

The classes (:class:`Preset`, :class:`Recipe`, :class:`PolicyBatch`) live in :mod:`.base`;
importing this package registers every preset (each family module registers its own).
"""

from rlpost.core.presets import (  # noqa: F401  (each module registers its presets)
    advantages,
    distill,
    exploration,
    mutual,
    objectives,
    ratios,
    regularized,
    standard,
)
from rlpost.core.presets.base import (
    BATCH_FIELDS,
    PRESETS,
    Choice,
    PolicyBatch,
    PolicyLoss,
    Preset,
    Recipe,
    get_preset,
    register_preset,
)

__all__ = [
    "BATCH_FIELDS",
    "PRESETS",
    "Choice",
    "PolicyBatch",
    "PolicyLoss",
    "Preset",
    "Recipe",
    "get_preset",
    "register_preset",
]
