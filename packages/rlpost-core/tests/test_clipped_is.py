"""Clipped IS + training-inference ratio correction (Ring-2.5-1T-Zero, catalog 004-02)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import CORRECTIONS, Choice, PolicyBatch, RatioInput, get_preset

torch.set_num_threads(1)

MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("band", [{}, {"mask_low": 0.9, "mask_high": 1.1}])
def test_correction_is_identity_when_engines_agree(level, band):
    old = torch.randn(2, 4)
    out = CORRECTIONS.build("clipped_is", level=level, **band)(
        RatioInput(old + 0.3, old, MASK, rollout_logp=old.clone())
    )
    assert torch.equal(out.weights, MASK) and torch.equal(out.mask, MASK)


def test_two_sided_clip_and_mask_band_hand_values():
    # engine log-ratios log(pi_old / pi_rollout) = (ln 3, ln 0.3, ln 0.1, ln 1.5)
    rho = torch.tensor([[3.0, 0.3, 0.1, 1.5]])
    rollout = torch.zeros(1, 4)
    m = torch.ones(1, 4)
    inp = RatioInput(rho.log(), rho.log(), m, rollout_logp=rollout)
    out = CORRECTIONS.build("clipped_is", low=0.5, high=2.0)(inp)
    assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.5, 1.5]]))  # clip to [0.5, 2]
    out = CORRECTIONS.build("clipped_is", low=0.5, high=2.0, mask_low=0.2, mask_high=5.0)(inp)
    assert_close(out.mask, torch.tensor([[1.0, 1.0, 0.0, 1.0]]))  # 0.1 < 0.2 dropped
    assert_close(out.weights, torch.tensor([[2.0, 0.5, 0.0, 1.5]]))
    assert out.metrics["is_masked_frac"] == pytest.approx(0.25)
    # tis caps one side only: 0.3 and 0.1 stay below 0.5
    tis = CORRECTIONS.build("tis", cap=2.0)(inp).weights
    assert tis[0, 1].item() == pytest.approx(0.3)


def test_sequence_level_uses_the_product():
    # sequence ratio = 1.5 * 2 = 3 -> clipped to 2 on every valid token
    rho = torch.tensor([[1.5, 2.0, 7.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    out = CORRECTIONS.build("clipped_is", level="sequence")(
        RatioInput(rho.log(), rho.log(), m, rollout_logp=torch.zeros(1, 3))
    )
    assert_close(out.weights, torch.tensor([[2.0, 2.0, 0.0]]))


def test_preset_loss_equals_no_correction_when_engines_agree():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(2, 4, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(2, 4, generator=g)
    adv = torch.tensor([1.0, -0.5])
    preset = get_preset("ring_zero")
    a = preset.build().policy_loss(PolicyBatch(logp, old, adv, MASK, rollout_logp=old.clone())).loss
    b = (
        preset.replace(correction=Choice("none"))
        .build()
        .policy_loss(PolicyBatch(logp, old, adv, MASK))
        .loss
    )
    assert torch.equal(a, b)
    # and it differs once the engines disagree
    c = (
        preset.build()
        .policy_loss(PolicyBatch(logp, old, adv, MASK, rollout_logp=old - math.log(3)))
        .loss
    )
    assert not torch.equal(a, c)


def test_validation_names_the_problem():
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        CORRECTIONS.build("clipped_is", low=1.2)
    with pytest.raises(ValueError, match="mask_high"):
        CORRECTIONS.build("clipped_is", mask_high=0.5)
