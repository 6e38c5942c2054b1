"""Soft-Pair-GRPO (catalog 001-14): pairwise preference rewards inside GRPO."""

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
