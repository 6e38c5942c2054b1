"""Mu-GRPO (catalog 000-17): relaxed clipping + negative-advantage veto."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput, PolicyBatch, get_preset
from rlpost.core.objectives.group import first_trigger, veto_keep_mask

torch.set_num_threads(1)
B, T = 4, 6


def batch():
    lengths = torch.tensor([6, 6, 6, 4])
    mask = (torch.arange(T) < lengths[:, None]).float()
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, T, generator=g) * 2
    logp = (old + 0.05 * torch.randn(B, T, generator=g)).requires_grad_(True)  # r in band
    adv = torch.tensor([-1.0, -0.5, 1.0, -2.0])
    trig = torch.tensor([2, -1, 1, 0])
    return mask, old, logp, adv, trig


def test_veto_masks_exactly_the_suffix_after_the_trigger():
    mask, old, logp, adv, trig = batch()
    keep = veto_keep_mask(trig, adv, mask)
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0],  # A < 0, trigger 2: tokens 3..5 vetoed, trigger token kept
            [1, 1, 1, 1, 1, 1],  # A < 0, no trigger (-1)
            [1, 1, 1, 1, 1, 1],  # A > 0: never vetoed, whatever its trigger
            [1, 0, 0, 0, 0, 0],  # A < 0, trigger 0; tokens 4, 5 are padding
        ],
        dtype=torch.float32,
    )
    assert torch.equal(keep, expected)
    out = OBJECTIVES.build("mu_grpo")(ObjectiveInput(logp, old, adv, mask, trigger_pos=trig))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    # every ratio is inside the relaxed band, so on kept tokens d(-r A)/d log pi = -r A
    r = (logp.detach() - old).exp()
    assert_close(g, -r * adv[:, None] * expected)
    assert (g[expected == 0] == 0).all() and (g[expected == 1] != 0).all()
    assert out.metrics["veto_frac"] == pytest.approx(6 / 22)  # 3 + 3 of 22 valid tokens


def test_default_trigger_is_first_token_leaving_the_relaxed_band():
    mask = torch.ones(2, 5)
    old = torch.zeros(2, 5)
    # ratios 1, 1.5, 2.5, 1, 0.3: token 2 is the first outside [0.5, 2]
    lr = torch.tensor([1.0, 1.5, 2.5, 1.0, 0.3]).log()
    logp = torch.stack([lr, lr]).requires_grad_(True)
    adv = torch.tensor([-1.0, 1.0])
    assert first_trigger(lr[None].expand(2, 5), mask, 0.5, 2.0).tolist() == [2, 2]
    out = OBJECTIVES.build("mu_grpo")(ObjectiveInput(logp, old, adv, mask))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    # negative row: tokens 3, 4 vetoed; token 2 (r = 2.5 > 2, A < 0) is unclipped: -r A
    assert_close(g[0], torch.tensor([1.0, 1.5, 2.5, 0.0, 0.0]))
    # positive row: no veto; token 2 is clipped (0), token 4 (r = 0.3 < 0.5, A > 0) unclipped
    assert_close(g[1], torch.tensor([-1.0, -1.5, 0.0, -1.0, -0.3]))
    assert out.metrics["trigger_frac"] == 0.5


def test_relaxed_clipping_keeps_stale_gradients_that_ppo_clips():
    # r = 1.5, A = 1: PPO's 0.2 clip gives no gradient; the relaxed [0.5, 2] band gives -r A
    logp = torch.full((1, 1), 1.5).log().requires_grad_(True)
    inp = ObjectiveInput(logp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1))
    (g_ppo,) = torch.autograd.grad(OBJECTIVES.build("ppo_clip")(inp).loss.sum(), logp)
    (g_mu,) = torch.autograd.grad(OBJECTIVES.build("mu_grpo")(inp).loss.sum(), logp)
    assert g_ppo.item() == 0.0 and g_mu.item() == pytest.approx(-1.5)


def test_recipe_passes_trigger_pos_and_veto_false_is_ppo_clip():
    mask, old, logp, adv, trig = batch()
    recipe = get_preset("mu_grpo").build()
    loss = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, trigger_pos=trig)).loss
    (g,) = torch.autograd.grad(loss, logp)
    assert (g[0, 3:] == 0).all() and (g[3, 1:] == 0).all() and (g[0, :3] != 0).all()
    inp = ObjectiveInput(logp, old, adv, mask, trigger_pos=trig)
    a = OBJECTIVES.build("mu_grpo", veto=False)(inp).loss
    b = OBJECTIVES.build("ppo_clip", clip_low=0.5, clip_high=1.0)(inp).loss
    assert torch.equal(a, b)


def test_trigger_pos_is_validated():
    mask, old, logp, adv, _ = batch()
    with pytest.raises(ValueError, match="trigger_pos must be \\[B\\]"):
        ObjectiveInput(logp, old, adv, mask, trigger_pos=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="trigger_pos must be an integer tensor"):
        ObjectiveInput(logp, old, adv, mask, trigger_pos=torch.zeros(B))
