"""F-TIS (catalog 000-09): filtered tokens contribute zero, truncation caps the weights."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import CORRECTIONS, OBJECTIVES, ObjectiveInput, RatioInput, get_preset

torch.set_num_threads(1)


def batch():
    # row 0: the local model's own sample (engine = trainer) -> rho = 1
    # row 1: another model's sample the local model finds implausible: log rho = -2 per
    #        token, geometric mean e^-2 = 0.135 < 0.2 -> filtered
    # row 2: another model's sample with one over-likely token: rho = (e^1.5, 1, e^-0.5)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -4.0, -3.5], [-0.5, -1.0, -2.0]])
    gen = old.clone()
    gen[1] = old[1] + 2.0
    gen[2] = old[2] - torch.tensor([1.5, 0.0, -0.5])
    mask = torch.ones(3, 3)
    return old, gen, mask


def test_filtered_tokens_contribute_zero_gradient():
    old, gen, mask = batch()
    logp = (old + 0.05).requires_grad_(True)
    corr = CORRECTIONS.build("ftis", cap=2.0, filter_low=0.2)(RatioInput(logp, old, mask, gen))
    assert_close(corr.mask, torch.tensor([[1.0] * 3, [0.0] * 3, [1.0] * 3]))
    adv = torch.tensor([1.0, 5.0, -1.0])  # a large advantage on the filtered row
    obj = OBJECTIVES.build("ppo_clip")(
        ObjectiveInput(logp, old, adv, corr.mask, None, corr.weights)
    )
    (g,) = torch.autograd.grad(obj.loss.sum(), logp)
    assert (g[1] == 0).all() and (obj.loss[1] == 0).all()
    assert (g[0] != 0).all() and (g[2] != 0).all()
    assert corr.metrics["ftis_filtered_frac"] == pytest.approx(1 / 3)


def test_truncation_caps_weights_and_own_samples_pass_unchanged():
    old, gen, mask = batch()
    corr = CORRECTIONS.build("ftis", cap=2.0, filter_low=0.2)(RatioInput(old, old, mask, gen))
    # row 2: min(e^1.5 = 4.48, 2) = 2, 1, e^-0.5 = 0.607 (kept: geometric mean e^(1/3) > 0.2)
    assert_close(corr.weights[2], torch.tensor([2.0, 1.0, math.exp(-0.5)]))
    assert_close(corr.weights[0], torch.ones(3))  # the local model's own sample
    assert (corr.weights <= 2.0).all()
    assert corr.metrics["ftis_truncated_frac"] == pytest.approx(1 / 6)


def test_token_level_filter_and_padding():
    old, gen, _ = batch()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    gen[0, 2] = old[0, 2] + 9.0  # padded position with a wild ratio: ignored
    corr = CORRECTIONS.build("ftis", filter_low=0.5, filter_level="token")(
        RatioInput(old, old, mask, gen)
    )
    # token filter keeps rho >= 0.5: row 2's e^-0.5 = 0.607 stays, row 1 (e^-2) goes
    assert_close(corr.mask, torch.tensor([[1.0, 1.0, 0.0], [0.0] * 3, [1.0] * 3]))
    assert corr.weights[0, 2] == 0


def test_preset_and_validation():
    assert get_preset("ftis").correction.name == "ftis"
    with pytest.raises(ValueError, match="cap"):
        CORRECTIONS.build("ftis", cap=0.5)
    with pytest.raises(ValueError, match="filter_low"):
        CORRECTIONS.build("ftis", filter_low=1.5)
