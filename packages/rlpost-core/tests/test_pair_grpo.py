"""Soft-Pair-GRPO (catalog 001-14): pairwise preference rewards inside GRPO."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput


def adv(name, rewards, groups, **params):
    return ADVANTAGES.build(name, **params)(
        AdvantageInput(torch.tensor(rewards), torch.tensor(groups))
    ).advantages


def test_hand_values():
    # group [3, 1, 1, 0]: response 0 beats 3 others -> 3 * 1/2 / 3 = 0.5;
    # responses 1, 2: beat 1 (the 0), lose to 1 (the 3), tie 1 -> 0; response 3 loses 3 -> -0.5
    assert_close(
        adv("soft_pair_grpo", [3.0, 1.0, 1.0, 0.0, 5.0], [0, 0, 0, 0, 1]),
        torch.tensor([0.5, 0.0, 0.0, -0.5, 0.0]),
    )


def policy_gradient(advantages, samples, logits):
    """sum_i A_i grad log softmax(logits)[y_i] on a toy softmax policy (autograd)."""
    lg = logits.clone().requires_grad_(True)
    (lg.log_softmax(-1)[samples] * advantages).sum().backward()
    return lg.grad


def test_binary_rewards_gradient_is_a_positive_multiple_of_grpo():
    torch.manual_seed(0)
    logits = torch.randn(6)
    samples = torch.multinomial(logits.softmax(-1), 8, replacement=True)
    rewards = (samples % 2 == 0).float()  # a binary verifier
    if rewards.std() == 0:
        rewards[0] = 1 - rewards[0]
    groups = torch.zeros(8, dtype=torch.long)
    g_pair = policy_gradient(
        adv("soft_pair_grpo", rewards.tolist(), groups.tolist()), samples, logits
    )
    g_grpo = policy_gradient(adv("grpo", rewards.tolist(), groups.tolist()), samples, logits)
    scale = (g_pair @ g_grpo) / (g_grpo @ g_grpo)
    assert scale > 0
    assert_close(g_pair, scale * g_grpo, atol=1e-6, rtol=1e-5)


def test_continuous_rewards_gradient_points_the_same_way_as_grpo():
    torch.manual_seed(1)
    for _ in range(20):
        logits = torch.randn(5)
        samples = torch.multinomial(logits.softmax(-1), 8, replacement=True)
        rewards = torch.randn(5)[samples] * 3 + 1  # continuous score per token choice
        groups = [0] * 8
        g_pair = policy_gradient(adv("soft_pair_grpo", rewards.tolist(), groups), samples, logits)
        g_grpo = policy_gradient(adv("grpo", rewards.tolist(), groups), samples, logits)
        if g_grpo.norm() > 1e-6:
            assert g_pair @ g_grpo > 0


def test_invariant_to_monotone_reward_transforms():
    r = torch.tensor([0.3, 2.0, -1.0, 0.3, 7.0, 1.0])
    g = [0, 0, 0, 0, 1, 1]
    assert_close(
        adv("soft_pair_grpo", r.tolist(), g), adv("soft_pair_grpo", (r**3 + 10).tolist(), g)
    )


# ---- Hard-Pair-GRPO: box-constrained target log-ratio, fitted quadratically ----


def objective_grad(name, logp, old, adv, mask, **params):
    from rlpost.core import OBJECTIVES, ObjectiveInput

    x = logp.clone().requires_grad_(True)
    out = OBJECTIVES.build(name, **params)(ObjectiveInput(x, old, adv, mask))
    (g,) = torch.autograd.grad(out.loss.sum(), x)
    return out, g


def test_hard_pair_gradient_at_the_old_policy_is_eta_times_grpo():
    torch.manual_seed(3)
    old = -torch.rand(4, 5)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2])  # |eta A| <= delta everywhere
    _, g_hard = objective_grad("hard_pair_grpo", old, old, adv, mask, eta=0.1, delta=0.2)
    _, g_ppo = objective_grad("ppo_clip", old, old, adv, mask)
    assert_close(g_hard, 0.1 * g_ppo)
    assert (g_hard[mask == 0] == 0).all()


def test_hard_pair_push_is_bounded_and_restores_past_the_target():
    old = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    adv = torch.tensor([100.0, -100.0])  # huge advantages: the target sits on the box
    out, g = objective_grad("hard_pair_grpo", old, old, adv, mask, eta=0.1, delta=0.2)
    assert_close(g, torch.tensor([[-0.2] * 3, [0.2] * 3]))  # |push| = delta, not eta A
    assert out.metrics["target_at_constraint_frac"] == 1.0
    # past the target (log r = 0.5 > tau = 0.2) the gradient pulls back; PPO's is zero
    logp = torch.full((2, 3), 0.5)
    _, g_hard = objective_grad("hard_pair_grpo", logp, old, adv, mask, eta=0.1, delta=0.2)
    _, g_ppo = objective_grad("ppo_clip", logp, old, adv, mask)
    assert (g_hard[0] > 0).all() and (g_ppo[0] == 0).all()


def test_hard_pair_fitting_lands_exactly_on_the_constrained_target():
    # toy softmax over 6 responses, 4 sampled with pairwise advantages: minimising the
    # loss moves each sampled response's log-ratio to clip(eta A, +-delta), no further
    samples = torch.tensor([0, 1, 2, 3])
    rewards = [3.0, 2.0, 1.0, 0.0]
    a = adv("soft_pair_grpo", rewards, [0, 0, 0, 0])
    logits0 = torch.zeros(6)
    old = logits0.log_softmax(0)[samples][:, None]
    logits = logits0.clone().requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=0.05)
    from rlpost.core import OBJECTIVES, ObjectiveInput

    fn = OBJECTIVES.build("hard_pair_grpo", eta=0.5, delta=0.2)
    for _ in range(600):
        logp = logits.log_softmax(0)[samples][:, None]
        loss = fn(ObjectiveInput(logp, old, a, torch.ones(4, 1))).loss.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    log_ratio = (logits.detach().log_softmax(0)[samples] - old[:, 0]).tolist()
    target = (0.5 * a).clamp(-0.2, 0.2).tolist()
    assert log_ratio == pytest.approx(target, abs=2e-3)


def test_hard_pair_preset():
    from rlpost.core import get_preset

    p = get_preset("hard_pair_grpo")
    assert p.catalog_id == "001-14" and p.objective.name == "hard_pair_grpo"
