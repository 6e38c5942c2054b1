from dataclasses import dataclass

import pytest
import torch

from rlpost.core import ADVANTAGES, AGGREGATIONS, AdvantageInput, NoParams, Registry, RegistryError


@dataclass(frozen=True)
class Inp:
    x: torch.Tensor


@dataclass(frozen=True)
class Out:
    y: torch.Tensor


@dataclass(frozen=True)
class ScaleParams:
    scale: float = 2.0
    mode: str = "a"


def make() -> Registry[Inp, Out]:
    reg: Registry[Inp, Out] = Registry("toy", Inp, Out)

    @reg.register("scale", ScaleParams)
    def scale(inp: Inp, p: ScaleParams) -> Out:
        return Out(inp.x * p.scale)

    return reg


def test_build_and_call():
    reg = make()
    assert reg.build("scale", scale=3.0)(Inp(torch.ones(2))).y.tolist() == [3.0, 3.0]
    assert reg("scale", Inp(torch.ones(1))).y.item() == 2.0
    assert "scale" in reg and reg.names() == ["scale"] and len(reg) == 1


def test_duplicate_name_raises():
    reg = make()
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("scale", NoParams)(lambda inp, p: Out(inp.x))


def test_unknown_name_lists_valid_ones():
    with pytest.raises(
        RegistryError, match=r"unknown advantage estimator 'grpoo'; valid names: .*grpo.*rloo"
    ):
        ADVANTAGES.build("grpoo")


def test_unknown_param_names_field_and_lists_valid():
    with pytest.raises(
        RegistryError, match=r"unknown parameter\(s\) \['scal'\].*\['mode', 'scale'\]"
    ):
        make().build("scale", scal=1.0)


def test_wrong_param_type_names_field():
    with pytest.raises(RegistryError, match="parameter 'scale' must be"):
        make().build("scale", scale="big")
    with pytest.raises(RegistryError, match="parameter 'scale_by_std'"):
        ADVANTAGES.build("grpo", scale_by_std="yes")


def test_missing_required_param_and_post_init_validation():
    with pytest.raises(RegistryError, match="normalizer must be > 0"):
        AGGREGATIONS.build("constant", normalizer=-1.0)


def test_wrong_input_type_raises():
    with pytest.raises(TypeError, match="expects AdvantageInput"):
        ADVANTAGES.build("grpo")(Inp(torch.ones(1)))  # type: ignore[arg-type]


def test_params_must_be_frozen_dataclass():
    @dataclass
    class Mutable:
        a: int = 1

    with pytest.raises(TypeError, match="frozen dataclass"):
        make().register("m", Mutable)


def test_input_dataclasses_are_frozen_and_validated():
    inp = AdvantageInput(torch.zeros(3))
    with pytest.raises(AttributeError):
        inp.rewards = torch.ones(3)  # type: ignore[misc]
    with pytest.raises(ValueError, match="rewards contain NaN"):
        AdvantageInput(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="group_ids must be"):
        AdvantageInput(torch.zeros(3), group_ids=torch.zeros(2, dtype=torch.long))
