"""SAO (catalog 004-14): strict double-sided token clip + value-baseline advantages."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, AdvantageInput, ObjectiveInput, PolicyBatch, get_preset

torch.set_num_threads(1)


def _grad(name, A):
    r = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])
    old = torch.full((2, 3), -1.0)
    logp = (old + r.log()).requires_grad_(True)
    out = OBJECTIVES.build(name)(ObjectiveInput(logp, old, A, torch.ones(2, 3)))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    return g, out


def test_both_sides_are_clipped_for_both_signs():
    A = torch.tensor([1.0, -1.0])
    g, out = _grad("sao", A)
    # inside [0.8, 1.2] only r = 1: gradient -r A; outside: 0 whatever the sign of A
    assert_close(g, torch.tensor([[0.0, -1.0, 0.0], [0.0, 1.0, 0.0]]))
    # PPO keeps the gradient where its min picks the unclipped side:
    # A > 0 with r = 0.5 (-0.5) and A < 0 with r = 1.5 (+1.5)
    g_ppo, _ = _grad("ppo_clip", A)
    assert_close(g_ppo, torch.tensor([[-0.5, -1.0, 0.0], [0.0, 1.0, 1.5]]))
    assert_close(out.loss.detach(), torch.tensor([[-0.5, -1.0, -1.5], [0.5, 1.0, 1.5]]))
    assert out.metrics["clip_frac_low"] == out.metrics["clip_frac_high"] == pytest.approx(1 / 3)


def test_preset_uses_one_rollout_and_value_baseline_advantages():
    preset = get_preset("sao")
    assert preset.group_size == 1 and preset.advantage.name == "gae"
    recipe = preset.build()
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.7, 9.0], [0.5, 0.1, 9.0, 9.0], [0.3, 0.3, 0.2, 0.9]])
    rewards = torch.tensor([1.0, 0.0, 1.0])
    out = recipe.advantages(AdvantageInput(rewards, None, mask, values=values))
    # gamma = lambda = 1: A_t = R - V_t on valid tokens, then whitened over them
    raw = (rewards[:, None] - values)[mask == 1]
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    assert_close(out.advantages[mask == 1], expected)
    assert (out.advantages[mask == 0] == 0).all()
    assert_close(out.returns[mask == 1], rewards[:, None].expand(3, 4)[mask == 1])
    # one policy step: token_mean of the strict-clip loss
    old = torch.full((3, 4), -1.0)
    x = torch.tensor([[0.0, 0.5, -0.5, 0.0], [0.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.3, 0.0]])
    logp = (old + x).requires_grad_(True)
    loss = recipe.policy_loss(PolicyBatch(logp, old, out.advantages, mask)).loss
    (g,) = torch.autograd.grad(loss, logp)
    r = x.exp()
    inside = (r >= 0.8) & (r <= 1.2)
    assert_close(g, -(inside * mask) * r * out.advantages / mask.sum())
