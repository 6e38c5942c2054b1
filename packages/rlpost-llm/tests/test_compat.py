"""Compatibility as declarations (rlpost.llm.train.compat): every pair of components where
one breaks what the other requires is refused at config load, naming both, and a newly
registered component is checked against the others without any table being edited.

The pairs are derived from the registrations themselves (rollout sources, step hooks,
input providers, switches, engines, parallel modes, loss couplings), so registering a
component with a declaration and an example puts its conflicts under test."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rlpost.core.contract import Declares, Party, Property
from rlpost.llm.config import ConfigError, load_config
from rlpost.llm.rollout.config import ENGINES
from rlpost.llm.rollout.sources import ROLLOUT_SOURCES
from rlpost.llm.rollout.sources.base import SCHEDULE, RolloutSource, register_source
from rlpost.llm.train import compat
from rlpost.llm.train.config import PARALLEL
from rlpost.llm.train.hooks import STEP_HOOKS
from rlpost.llm.train.providers import INPUT_PROVIDERS

# the recipe's couplings: an entry of each kind, and what switches it on
COUPLINGS = {
    "a loss coupling the whole batch": (
        "algo.objective.name=ess_adaptive",
        "optim.micro_batch_size=1024",  # (the whole step: 16 prompts x 64)
    ),
    "a loss coupling a group": ("algo.objective.name=lpo",),
    "an advantage coupling the whole batch": ("algo.advantage.name=reinforce_pp",),
    "an entry reading the batch's dynamics": ("algo.advantage.name=fade",),
}


@dataclass(frozen=True)
class Holder:
    """A registered declaration and the overrides that switch its party on."""

    what: str
    declares: Declares
    example: tuple[str, ...]


def holders() -> list[Holder]:
    out = [Holder(f"switch {s.name}", s.declares, s.example) for s in compat.switches()]
    for name, cls in ROLLOUT_SOURCES.items():
        out.append(Holder(f"rollout source {name}", cls.declares, cls.example))
    for reg in (STEP_HOOKS, INPUT_PROVIDERS):
        out += [Holder(f"{reg.kind} {c.name}", c.declares, c.example) for c in reg.values()]
    out += [Holder(f"engine {n}", d, (f"rollout.engine={n}",)) for n, d in ENGINES.items()]
    out += [Holder(f"parallel {n}", d, (f"train.parallel={n}",)) for n, d in PARALLEL.items()]
    return [h for h in out if h.declares.requires or h.declares.breaks]


def coupling_holders() -> list[Holder]:
    out = []
    for what, example in COUPLINGS.items():
        cfg = load_config(None, list(example))
        preset = cfg.preset()
        for party in compat.coupling_parties(preset.build()):
            out.append(Holder(f"{what}: {party.name}", party.declares, example))
    return out


def party_of(h: Holder) -> Party:
    """The party ``h`` is in a config of its own example (by its declaration)."""
    cfg = load_config(None, list(h.example))
    preset = cfg.preset()
    found = [p for p in compat.parties(cfg, preset, preset.build()) if p.declares == h.declares]
    assert found, f"{h.what}: no party of its declaration with {h.example}"
    return found[0]


def declared_conflicts() -> list[tuple[Holder, Holder, Property]]:
    every = holders() + coupling_holders()
    pairs = []
    for a in every:
        for prop in a.declares.breaks:
            for b in every:
                if b is not a and prop in b.declares.requires and a.example != b.example:
                    pairs.append((a, b, prop))
    return pairs


def test_every_declaration_has_an_example_that_switches_it_on():
    missing = [h.what for h in holders() if not h.example]
    assert not missing, f"give these an example (config overrides): {missing}"
    for h in holders():
        party_of(h)  # loads on its own, and its party is among the config's


CONFLICTS = declared_conflicts()


@pytest.mark.parametrize(
    "breaker, requirer, prop",
    CONFLICTS,
    ids=[f"{a.what} x {b.what} ({p})" for a, b, p in CONFLICTS],
)
def test_the_generic_check_names_both_parties(breaker, requirer, prop):
    overrides = [*breaker.example, *requirer.example]
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    msg = str(err.value)
    a, b = party_of(breaker), party_of(requirer)
    # the breaker's reason and the requirer's, each after its party's name
    assert f"{a.name} {breaker.declares.breaks[prop]}" in msg, msg
    assert f"{b.name} {requirer.declares.requires[prop]}" in msg, msg


def test_there_are_conflicts_of_every_kind():
    kinds = {(a.what.split()[0], b.what.split()[0]) for a, b, _ in CONFLICTS}
    assert len(CONFLICTS) >= 60 and len(kinds) >= 10, (len(CONFLICTS), kinds)


@pytest.fixture
def toy_source():
    @register_source
    class NeedsTorch(RolloutSource):
        """A schedule generating with rlpost's torch engines (a toy)."""

        name = "toy_needs_torch"
        layer = SCHEDULE
        label = "train.pipeline toy_needs_torch"
        declares = Declares(requires={Property.TORCH_ENGINE: "reads the engine's torch module"})

    yield NeedsTorch
    del ROLLOUT_SOURCES["toy_needs_torch"]


def test_a_new_source_with_a_conflicting_requirement_is_refused_without_a_table(toy_source):
    load_config(None, ["train.pipeline=toy_needs_torch"])  # on its own: fine
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.pipeline=toy_needs_torch", "rollout.engine=vllm"])
    msg = str(err.value)
    assert "the vllm engine generates in vLLM" in msg
    assert "train.pipeline toy_needs_torch reads the engine's torch module" in msg


def test_conflicts_lists_each_pair_once_in_the_parties_order():
    a = Party("a", Declares(breaks={Property.WHOLE_BATCH: "streams"}))
    b = Party("b", Declares(requires={Property.WHOLE_BATCH: "couples"}))
    c = Party("c", Declares(requires={Property.WHOLE_BATCH: "reads it"}, breaks={}))
    from rlpost.core.contract import conflicts

    assert conflicts([a, b, c]) == ["a streams; b couples", "a streams; c reads it"]
    assert conflicts([b, c]) == []  # requiring alone conflicts with nothing
    selfish = Party("s", Declares({Property.ONE_POLICY: "x"}, {Property.ONE_POLICY: "y"}))
    assert conflicts([selfish]) == []  # a party never conflicts with itself
