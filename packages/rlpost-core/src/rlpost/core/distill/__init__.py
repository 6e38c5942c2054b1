"""On-policy distillation (the ``DISTILL_ESTIMATORS`` registry) and its schedules.

=================  ===========================================================
module             contents
=================  ===========================================================
``base``           DistillInput / DistillOutput, TeacherDistributions, the surrogate
``estimators``     full, topk, sampled (reverse KL to a teacher, per token); jsd, jsd_topk
``schedule``       DistillSchedule: constant, anneal (ATOD's OPD -> RL schedule)
``rows``           which responses are distilled (OPSD's correct / incorrect filters)
``turns``          TurnReweight / turn_weights: ATOD's T-DUR
=================  ===========================================================
"""

from rlpost.core.distill import estimators  # noqa: F401  (registration)
from rlpost.core.distill.base import (
    DISTILL_ESTIMATORS,
    DistillInput,
    DistillOutput,
    TeacherDistributions,
)
from rlpost.core.distill.estimators import DistillParams, FullParams
from rlpost.core.distill.rows import ROW_FILTERS, distill_rows
from rlpost.core.distill.schedule import DistillSchedule
from rlpost.core.distill.turns import TurnReweight, turn_weights

__all__ = [
    "DISTILL_ESTIMATORS",
    "ROW_FILTERS",
    "DistillInput",
    "DistillOutput",
    "DistillParams",
    "DistillSchedule",
    "FullParams",
    "TeacherDistributions",
    "TurnReweight",
    "distill_rows",
    "turn_weights",
]
