"""Preference losses on chosen / rejected responses (the ``PREFERENCE_LOSSES`` registry).

=================  ===========================================================
module             entries
=================  ===========================================================
``classic``        dpo, ipo, simpo
``seed``           xi_dpo (001-06), gate_dpo (001-20), ed_dpo (001-04)
=================  ===========================================================
"""

from rlpost.core.preference import classic, seed  # noqa: F401  (registration)
from rlpost.core.preference.base import PREFERENCE_LOSSES, PreferenceInput, PreferenceOutput
from rlpost.core.preference.seed import xi_from_initial

__all__ = ["PREFERENCE_LOSSES", "PreferenceInput", "PreferenceOutput", "xi_from_initial"]
