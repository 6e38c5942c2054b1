"""The diffusion package dispatches through its registries only: no source line compares a
value with the name of a registered sampler, method or training family, and every
method's choices are registered entries that fit together."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlpost.diffusion
from rlpost.core.testing import name_comparisons
from rlpost.diffusion.families import FAMILIES
from rlpost.diffusion.methods import METHODS, NEEDS
from rlpost.diffusion.regularizers import REGULARIZERS
from rlpost.diffusion.samplers import SAMPLERS

ROOT = Path(rlpost.diffusion.__file__).parent


def test_no_source_compares_with_a_sampler_method_or_family_name():
    names = set(SAMPLERS.names()) | set(METHODS.names()) | set(FAMILIES.names())
    assert name_comparisons(ROOT, names) == set()
    assert name_comparisons(ROOT, {"sd3"})  # (the scan finds a model-name comparison: it works)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_methods_choices_are_registered_and_fit(name):
    m = METHODS.get(name)
    family = FAMILIES.get(m.family.name)
    assert family.stochastic == SAMPLERS.get(m.sampler.name).stochastic
    SAMPLERS.params(m.sampler.name, m.sampler.params)
    for r in m.regularizers:
        REGULARIZERS.params(r.name, r.params)
    assert m.needs <= NEEDS


def test_a_method_whose_family_and_sampler_do_not_fit_is_refused():
    from rlpost.core.presets import Choice
    from rlpost.diffusion.methods import Method, register_method

    bad = Method(name="bad", paper="-", sampler=Choice("ode"), family=Choice("sde_replay"),
                 advantage=Choice("grpo"), loss=lambda inp, p: None)  # fmt: skip
    with pytest.raises(TypeError, match="needs a stochastic sampler"):
        register_method(bad)
    assert "bad" not in METHODS
