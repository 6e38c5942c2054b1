"""The method/trainer contract: every registered entry passes its registry's checks with
inputs built from its own declarations (rlpost.core.testing), and the checks catch an
entry that reads an input it did not declare."""

from dataclasses import dataclass

import pytest
import torch

from rlpost.core import (
    ADVANTAGES,
    OBJECTIVES,
    REGISTRIES,
    AdvantageInput,
    AdvantageOutput,
    ContractError,
    Coupling,
    Input,
    ObjectiveInput,
    ObjectiveOutput,
    Registry,
    get_preset,
)
from rlpost.core.registry import NoParams
from rlpost.core.testing import UndeclaredInputError, check_entry

ENTRIES = [(kind, name) for kind, reg in REGISTRIES.items() for name in reg.names()]


@pytest.mark.parametrize(("kind", "name"), ENTRIES, ids=[f"{k}-{n}" for k, n in ENTRIES])
def test_every_entry_meets_its_registry_contract(kind, name):
    check_entry(REGISTRIES[kind], name)


def _like(reg: Registry) -> Registry:
    """A fresh registry with the same input vocabulary (to register rogue entries in)."""
    return Registry(reg.kind, reg.input_type, reg.output_type, inputs=reg.inputs, gated=reg.gated)


def test_an_entry_reading_an_undeclared_input_fails_the_contract_test():
    reg = _like(OBJECTIVES)

    @reg.register("rogue")  # reads group ids without declaring them
    def rogue(inp: ObjectiveInput, p: NoParams) -> ObjectiveOutput:
        ids = inp.group_ids if inp.group_ids is not None else torch.zeros(len(inp.logp))
        scale = 1.0 + (ids[:, None] == ids[:1, None]).float()  # first group counts double
        return ObjectiveOutput(-inp.adv_tokens() * inp.logp_valid() * inp.mask_f * scale, {})

    with pytest.raises(UndeclaredInputError, match="group_ids"):
        check_entry(reg, "rogue", like=OBJECTIVES)

    @reg.register("declared", needs={Input.GROUP_IDS}, coupling=Coupling.GROUP)
    def declared(inp: ObjectiveInput, p: NoParams) -> ObjectiveOutput:
        return rogue(inp, p)

    check_entry(reg, "declared", like=OBJECTIVES)  # the same code, declared: passes


def test_an_undeclared_optional_read_is_caught_too():
    reg = _like(ADVANTAGES)

    @reg.register("sneaky")  # uses features only when present: still an undeclared read
    def sneaky(inp: AdvantageInput, p: NoParams) -> AdvantageOutput:
        a = inp.rewards - inp.rewards.mean()
        if inp.prompt_features is not None:
            a = a * inp.prompt_features.norm(dim=1).clamp_min(1.0)
        return AdvantageOutput(a if inp.mask is None else a[:, None] * inp.mask)

    with pytest.raises(UndeclaredInputError, match="prompt_features"):
        check_entry(reg, "sneaky", like=ADVANTAGES)


def test_bound_entries_never_see_undeclared_inputs_and_name_missing_needs():
    seen = {}
    reg = _like(ADVANTAGES)

    @reg.register("peek", reads={Input.VALUES})
    def peek(inp: AdvantageInput, p: NoParams) -> AdvantageOutput:
        seen.update(values=inp.values, features=inp.prompt_features)
        return AdvantageOutput(inp.rewards)

    r = torch.ones(3)
    reg.build("peek")(
        AdvantageInput(
            r, mask=torch.ones(3, 2), values=torch.ones(3, 2), prompt_features=torch.ones(3, 4)
        )
    )
    assert seen["values"] is not None and seen["features"] is None
    with pytest.raises(ContractError, match=r"'basis' needs prompt_features"):
        ADVANTAGES.build("basis")(AdvantageInput(r))


def test_declarations_are_checked_at_registration():
    reg = _like(OBJECTIVES)
    with pytest.raises(TypeError, match="does not carry"):
        reg.register("bad", needs={Input.VALUES})  # objectives never receive critic values


@dataclass(frozen=True)
class _P:
    use: bool = False


def test_declarations_may_depend_on_params():
    reg = _like(OBJECTIVES)

    @reg.register("maybe", _P, needs=lambda p: {Input.TRIGGER_POS} if p.use else set())
    def maybe(inp, p):
        raise NotImplementedError

    assert reg.build("maybe").needs == frozenset()
    assert reg.build("maybe", use=True).needs == {Input.TRIGGER_POS}
    # in the registry: conspo needs the training progress only with a scheduled margin
    assert Input.DYNAMICS not in OBJECTIVES.build("conspo").needs
    assert Input.DYNAMICS in OBJECTIVES.build("conspo", margin_end=0.1).needs
    # REVA's KL couples the batch only when it centres the entropy on the batch mean
    from rlpost.core import KL_ESTIMATORS

    assert KL_ESTIMATORS.build("reva_rer").coupling == Coupling.ROW
    assert KL_ESTIMATORS.build("reva_rer", entropy_center=None).coupling == Coupling.BATCH


def test_recipe_check_names_the_entry_and_the_missing_input():
    recipe = get_preset("ppo").build()
    assert Input.VALUES in recipe.needs()
    with pytest.raises(ContractError, match=r"advantage estimator 'gae' needs values"):
        recipe.check({Input.MASK, Input.REF_LOGPROBS}, who="a critic-free trainer")
    recipe.check({Input.MASK, Input.VALUES, Input.REF_LOGPROBS})
    assert get_preset("lpo").build().coupling() == Coupling.GROUP
    assert get_preset("ess_adaptive").build().coupling() == Coupling.BATCH
    assert get_preset("grpo").build().coupling() == Coupling.ROW


def test_an_objective_declared_inert_at_zero_advantage_must_be(monkeypatch):
    """``INERT_AT_ZERO_ADVANTAGE`` lets a trainer drop zero-advantage rows: the contract
    test refuses a declared entry whose zero-advantage rows still move off-policy."""
    import rlpost.core.testing as testing

    check_entry(OBJECTIVES, "hard_pair_grpo")  # undeclared: fits log r to 0, passes
    monkeypatch.setattr(testing, "INERT_AT_ZERO_ADVANTAGE", frozenset({"hard_pair_grpo"}))
    with pytest.raises(AssertionError, match="declared inert at zero advantage"):
        check_entry(OBJECTIVES, "hard_pair_grpo")
