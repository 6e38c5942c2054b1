"""GCPO (catalog 000-10): geometry-aware, reward-calibrated uncertainty weights on GRPO."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset
from rlpost.core.advantages import semantic_disagreement


def gcpo(r, g, f, **p):
    return ADVANTAGES.build("gcpo", **p)(AdvantageInput(r, g, completion_features=f))


def test_semantic_disagreement_hand_values():
    f = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 0.0]])
    g = torch.tensor([0, 0, 0, 1])
    u = semantic_disagreement(f, g)
    c = torch.tensor([2.0, 1.0]) / 5**0.5  # group 0's mean direction
    assert_close(u, torch.tensor([1 - c[0], 1 - c[0], 1 - c[1], 0.0]))


def test_constant_uncertainty_is_exactly_grpo():
    torch.manual_seed(0)
    r, g = torch.bernoulli(torch.full((24,), 0.5)), torch.arange(24) // 6
    same = torch.randn(1, 5).expand(24, 5)  # every response points the same way: u = 0
    out = gcpo(r, g, same).advantages
    assert_close(out, ADVANTAGES.build("grpo")(AdvantageInput(r, g)).advantages)


def test_weights_are_monotone_in_calibrated_uncertainty():
    torch.manual_seed(1)
    B, n = 48, 6
    g = torch.arange(B) // n
    # groups whose answers disagree semantically also disagree in reward (informative)
    spread = torch.linspace(0.0, 1.5, B // n)[g]
    f = torch.randn(B // n, 16)[g] + spread[:, None] * torch.randn(B, 16)
    r = torch.bernoulli(0.97 - 0.3 * spread)  # agreeing groups are (nearly) all right
    out = gcpo(r, g, f)
    grpo = ADVANTAGES.build("grpo")(AdvantageInput(r, g)).advantages
    nz = grpo.abs() > 1e-6
    w = out.advantages[nz] / grpo[nz]
    u = semantic_disagreement(f, g)[nz]
    slope = out.metrics["gcpo_calibration_slope"]
    order = u.argsort()
    # the weight is a monotone function of u, in the direction of the calibration slope
    dw = torch.diff(w[order]) * (1 if slope > 0 else -1)
    assert (dw >= -1e-5).all()
    assert slope > 0 and w.max() > 1.2 and w.min() < 0.9


def test_needs_features_and_validates():
    with pytest.raises(ValueError, match="features"):
        ADVANTAGES.build("gcpo")(AdvantageInput(torch.ones(4)))
    with pytest.raises(ValueError, match="w_min"):
        ADVANTAGES.build("gcpo", w_min=2.0)
    assert get_preset("gcpo").catalog_id == "000-10"
