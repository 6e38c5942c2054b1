"""The robot package dispatches through its registries: no source compares a value with
the name of a registered algorithm or policy kind (but for two names that mean something
else there), and every algorithm's policy kind is registered with light settings."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlpost.robot
from rlpost.core.testing import name_comparisons
from rlpost.robot.algos import ALGORITHMS
from rlpost.robot.policies.kinds import POLICY_KINDS

ROOT = Path(rlpost.robot.__file__).parent
OTHER_MEANINGS = {
    ("policies/act.py", "act"),  # lerobot's own policy type in a checkpoint's config
    ("algos/configuration_craft.py", "craft"),  # one of CRAFT's advantage modes
}


def test_no_source_compares_with_an_algorithm_or_policy_kind_name():
    names = set(ALGORITHMS.names()) | set(POLICY_KINDS.names())
    assert name_comparisons(ROOT, names) == OTHER_MEANINGS


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithms_policy_kind_is_registered(name):
    kind = POLICY_KINDS[ALGORITHMS.get(name).policy_kind]
    assert kind.config.model_validate({}) is not None  # (settings with defaults)
    assert callable(kind.loader()) and callable(kind.builder())
