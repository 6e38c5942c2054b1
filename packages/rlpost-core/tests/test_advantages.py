import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, kl_reward_penalty


def adv(name, rewards, groups=None, **kw):
    inp_kw = {
        k: kw.pop(k) for k in ("mask", "values", "token_rewards", "reward_weights") if k in kw
    }
    g = None if groups is None else torch.tensor(groups)
    return ADVANTAGES.build(name, **kw)(AdvantageInput(torch.tensor(rewards), g, **inp_kw))


def test_grpo_hand_values():
    # group 0: rewards 1, 0, 0 -> mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    # A = (1 - 1/3) / sqrt(1/3) = 1.1547, (0 - 1/3)/sqrt(1/3) = -0.5774
    # group 1: rewards 2, 4 -> mean 3, std sqrt(2) -> A = -1/sqrt(2), +1/sqrt(2)
    out = adv("grpo", [1.0, 0.0, 0.0, 2.0, 4.0], [0, 0, 0, 7, 7], eps=0.0)
    s = math.sqrt(1 / 3)
    assert_close(
        out.advantages, torch.tensor([2 / 3 / s, -1 / 3 / s, -1 / 3 / s, -(0.5**0.5), 0.5**0.5])
    )


def test_dr_grpo_no_std():
    # Dr. GRPO: A = r - mean_g: group 0 mean 1/3; group 1 mean 3
    out = adv("grpo", [1.0, 0.0, 0.0, 2.0, 4.0], [0, 0, 0, 1, 1], scale_by_std=False)
    assert_close(out.advantages, torch.tensor([2 / 3, -1 / 3, -1 / 3, -1.0, 1.0]))


def test_rloo_hand_values():
    # group [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1; A_1 = 0 - (1+0)/2 = -0.5; singleton -> 0
    out = adv("rloo", [1.0, 0.0, 0.0, 5.0], [0, 0, 0, 1])
    assert_close(out.advantages, torch.tensor([1.0, -0.5, -0.5, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp"])
def test_identical_reward_groups_give_zero_advantage_no_nan(name):
    kw = {"subtract_group_mean": True} if name == "reinforce_pp" else {}
    out = adv(name, [1.0, 1.0, 1.0, 0.0, 0.0, 3.0], [0, 0, 0, 1, 1, 2], **kw)
    assert torch.isfinite(out.advantages).all()
    assert_close(out.advantages, torch.zeros(6))


def test_group_ids_need_not_be_contiguous_or_sorted():
    a = adv("grpo", [1.0, 3.0, 0.0, 2.0], [9, 4, 9, 4]).advantages
    b = adv("grpo", [1.0, 0.0, 3.0, 2.0], [0, 0, 1, 1]).advantages
    assert_close(a[[0, 2, 1, 3]], b)


def test_vector_rewards_weighted_sum_default_and_weights():
    r = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    # default weights (1, 1): scalar rewards 1, 0, 2 -> same as scalar GRPO
    assert_close(
        adv("grpo", r, [0, 0, 0]).advantages, adv("grpo", [1.0, 0.0, 2.0], [0, 0, 0]).advantages
    )
    # weights (0, 1): scalar rewards 0, 0, 1
    out = adv("grpo", r, [0, 0, 0], reward_weights=torch.tensor([0.0, 1.0]))
    assert_close(out.advantages, adv("grpo", [0.0, 0.0, 1.0], [0, 0, 0]).advantages)


def test_mask_broadcasts_to_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = adv("grpo", [1.0, 0.0], [0, 0], mask=mask, eps=0.0)
    # A = +-1/sqrt(2) on valid tokens, 0 elsewhere
    a = 0.5**0.5
    assert_close(out.advantages, torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0]]))


def test_reinforce_pp_batch_whitening_hand_values():
    # no mask: rewards 1, 2, 3 -> mean 2, unbiased std 1 -> A = -1, 0, 1 (across groups)
    out = adv("reinforce_pp", [1.0, 2.0, 3.0], [0, 1, 2], eps=0.0)
    assert_close(out.advantages, torch.tensor([-1.0, 0.0, 1.0]))


def test_reinforce_pp_token_level_returns_include_kl_rewards():
    # one response of 3 tokens, outcome 1, token rewards -0.1 each (in-reward KL)
    # returns-to-go: t0 = 1 - 0.3 = 0.7, t1 = 0.8, t2 = 0.9
    mask = torch.ones(1, 3)
    out = adv("reinforce_pp", [1.0], [0], mask=mask, token_rewards=torch.full((1, 3), -0.1))
    assert_close(out.returns, torch.tensor([[0.7, 0.8, 0.9]]))
    # whitened over the 3 tokens: mean 0.8, std 0.1 -> -1, 0, 1
    assert_close(out.advantages, torch.tensor([[-1.0, 0.0, 1.0]]), atol=1e-5, rtol=1e-5)


def test_gae_hand_values():
    # one response, 3 valid tokens then padding; outcome reward 1 on the last valid token
    # V = (0.5, 0.6, 0.7); gamma = 1, lambda = 0.5
    # delta_2 = 1 - 0.7 = 0.3; delta_1 = 0 + 0.7 - 0.6 = 0.1; delta_0 = 0.6 - 0.5 = 0.1
    # A_2 = 0.3; A_1 = 0.1 + 0.5*0.3 = 0.25; A_0 = 0.1 + 0.5*0.25 = 0.225
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # value on padding must be ignored
    out = adv("gae", [1.0], mask=mask, values=values, gamma=1.0, lam=0.5, whiten=False)
    assert_close(out.advantages, torch.tensor([[0.225, 0.25, 0.3, 0.0]]))
    assert_close(out.returns, torch.tensor([[0.725, 0.85, 1.0, 0.0]]))


def test_gae_lambda_one_equals_monte_carlo_minus_value():
    torch.manual_seed(0)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2])
    values = torch.randn(2, 5)
    out = adv("gae", [2.0, -1.0], mask=mask, values=values, gamma=1.0, lam=1.0, whiten=False)
    assert_close(out.advantages, (torch.tensor([[2.0], [-1.0]]) - values) * mask)


def test_gae_requires_values():
    with pytest.raises(ValueError, match="'gae' needs values"):
        adv("gae", [1.0], mask=torch.ones(1, 2))


def test_kl_reward_penalty_is_detached_and_signed():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0]])
    r = kl_reward_penalty(logp, ref, torch.ones(1, 2), beta=0.1, estimator="k1")
    # k1 = logp - ref = (0.5, 0) -> reward -0.05, 0
    assert_close(r, torch.tensor([[-0.05, 0.0]]))
    assert not r.requires_grad


def test_kl_reward_penalty_honours_a_bound_estimators_params():
    from rlpost.core.kl import KL_ESTIMATORS

    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-3.0, -2.0]])  # log-ratio (2, 0)
    clamped = KL_ESTIMATORS.build("k1", clamp=0.5)
    # the bound entry clamps the log-ratio at 0.5 -> reward -0.1 * 0.5; by name: -0.1 * 2
    assert_close(
        kl_reward_penalty(logp, ref, torch.ones(1, 2), 0.1, clamped), torch.tensor([[-0.05, 0.0]])
    )
    assert_close(
        kl_reward_penalty(logp, ref, torch.ones(1, 2), 0.1, "k1"), torch.tensor([[-0.2, 0.0]])
    )


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_response_level_estimators_fold_in_reward_token_penalties(name):
    # in-reward KL: token rewards (-0.1, -0.2) on response 0 and (-0.6, pad) on response 1
    # -> response rewards 1 - 0.3 = 0.7 and 0 - 0.6 = -0.6
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    tr = torch.tensor([[-0.1, -0.2], [-0.6, -5.0]])  # the padded -5 must be ignored
    with_pen = adv(
        name,
        [1.0, 0.0],
        [0, 0],
        mask=mask,
        token_rewards=tr,
        **({"scale_by_std": False} if name == "grpo" else {}),
    ).advantages
    folded = adv(
        name, [0.7, -0.6], [0, 0], mask=mask, **({"scale_by_std": False} if name == "grpo" else {})
    ).advantages
    assert_close(with_pen, folded)
    plain = adv(
        name, [1.0, 0.0], [0, 0], mask=mask, **({"scale_by_std": False} if name == "grpo" else {})
    )
    assert not torch.allclose(with_pen, plain.advantages)


def test_reward_to_go_fast_path_equals_the_scan():
    from rlpost.core.advantages import reward_to_go

    torch.manual_seed(0)
    r = torch.randn(5, 9)
    lengths = torch.tensor([9, 1, 4, 7, 3])
    mask = (torch.arange(9) < lengths[:, None]).float()
    fast = reward_to_go(r, mask, gamma=1.0)  # right-padded, undiscounted: cumulative sum
    scan = reward_to_go(r, mask, gamma=1.0 - 1e-12)  # forces the reverse scan
    assert_close(fast, scan)
    # hand check of one row: G_t = sum_{s >= t} r_s over the 4 valid tokens
    assert_close(fast[2, :4], r[2, :4].flip(0).cumsum(0).flip(0))
    assert (fast[mask == 0] == 0).all()


@pytest.mark.parametrize("bad", [math.inf, math.nan, -0.5])
def test_training_dynamics_rejects_non_finite_or_negative_entropy(bad):
    from rlpost.core import TrainingDynamics

    for field in ("entropy", "initial_entropy"):
        with pytest.raises(ValueError, match=f"{field} must be a finite entropy"):
            TrainingDynamics(progress=0.5, **{field: bad})
    TrainingDynamics(progress=0.5, entropy=0.0, initial_entropy=2.0)  # valid
