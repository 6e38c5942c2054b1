"""TEA and Prefix-TEA (catalog 001-02): best-of-N advantages from m << N rollouts."""

import itertools

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset
from rlpost.core.advantages.best_of_n import (
    PrefixTEAParams,
    best_of_k_ustat,
    gaussian_best_of_n_gain,
    prefix_tea,
)


def adv(name, rewards, groups, **params):
    return ADVANTAGES.build(name, **params)(AdvantageInput(rewards, groups)).advantages


def test_ustat_equals_brute_force_over_subsets():
    torch.manual_seed(0)
    r = torch.randn(11, dtype=torch.float64)
    g = torch.tensor([0] * 6 + [1] * 5)
    for k in (1, 2, 3, 5):
        brute = []
        for i in range(11):
            others = [j for j in range(11) if g[j] == g[i] and j != i]
            vals = [max([r[i]] + [r[j] for j in s]) for s in itertools.combinations(others, k - 1)]
            brute.append(sum(vals) / len(vals))
        assert_close(best_of_k_ustat(r, g, k), torch.stack([torch.as_tensor(v) for v in brute]))
    with pytest.raises(ValueError, match="at least 6"):
        best_of_k_ustat(r, g, 6)


def test_gaussian_gain_matches_monte_carlo():
    torch.manual_seed(0)
    z = torch.tensor([-1.0, 0.0, 1.0, 2.5])
    assert_close(gaussian_best_of_n_gain(z, 1), z)
    far = torch.tensor([-20.0, -8.5, 9.0, 30.0])  # off the table's [-8, 8] grid
    assert_close(gaussian_best_of_n_gain(far, 1), far)  # h_1(z) = z everywhere
    for n in (16, 64):
        others = torch.randn(400_000, n - 1).amax(1)
        mc = torch.stack([torch.maximum(others, v).mean() for v in z])
        assert_close(gaussian_best_of_n_gain(z, n), mc, atol=6e-3, rtol=0)


def test_n1_is_dr_grpo_and_equal_rewards_give_zero():
    torch.manual_seed(1)
    r, g = torch.randn(16), torch.arange(16) // 8
    base = adv("grpo", r, g, scale_by_std=False)
    assert_close(adv("tea", r, g, n=1), base, atol=1e-5, rtol=0)
    assert_close(adv("prefix_tea", r, g, n=1), base, atol=1e-5, rtol=0)
    flat = torch.ones(8)
    for name in ("tea", "prefix_tea"):
        out = adv(name, flat, torch.zeros(8, dtype=torch.long), n=64)
        assert torch.isfinite(out).all() and out.abs().max() == 0


def test_best_of_n_credit_concentrates_on_the_top_as_n_grows():
    r, g = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]), torch.zeros(8, dtype=torch.long)
    for name in ("tea", "prefix_tea"):
        top_share = []
        for n in (1, 4, 16, 64):
            a = adv(name, r, g, n=n)
            assert int(a.argmax()) == 7 and a[7] > 0
            top_share.append((a[7] / a.abs().sum()).item())
        # the share of the total credit the best response gets grows with N
        assert all(b >= a - 1e-6 for a, b in itertools.pairwise(top_share)), (name, top_share)
        assert top_share[-1] > top_share[0] + 0.1


def test_prefix_tea_is_exact_and_unbiased_when_n_fits_in_the_group():
    # N <= m: Prefix-TEA is the U-statistic itself; its mean over many groups equals the
    # exact best-of-N gain of the discrete reward distribution
    torch.manual_seed(2)
    values, probs = torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0.5, 0.3, 0.2])
    draws = values[torch.multinomial(probs, 8 * 20000, replacement=True)].double()
    groups = torch.arange(draws.numel()) // 8
    u = best_of_k_ustat(draws, groups, 4)
    for v in values:
        sel = draws == v
        # exact E[max(v, M_3)], M_3 = max of 3 draws
        cdf = torch.cumsum(probs, 0).double()
        pmf_max = torch.diff(torch.cat([torch.zeros(1, dtype=torch.float64), cdf**3]))
        exact = (torch.maximum(values.double(), v) * pmf_max).sum()
        assert_close(u[sel].mean(), exact, atol=0.02, rtol=0)


def test_prefix_tea_leaves_each_response_out_of_its_own_tail_fit():
    # one response's value moves the tail the others are judged by, never its own: raising
    # r_0 leaves g_0's leave-one-out statistics unchanged, so g_0 grows like the tail gain
    r, g = torch.tensor([0.0, 0.3, -0.4, 1.1, 0.2, -1.0]), torch.zeros(6, dtype=torch.long)
    base = prefix_tea(AdvantageInput(r, g), PrefixTEAParams(n=32, scale_by_std=False))
    r2 = r.clone()
    r2[0] = 3.0  # now the best; TEA's own-sample std would grow with it
    out = prefix_tea(AdvantageInput(r2, g), PrefixTEAParams(n=32, scale_by_std=False))
    assert int(out.advantages.argmax()) == 0 and out.advantages[0] > base.advantages[0]
    with pytest.raises(ValueError, match=">= 3"):
        prefix_tea(AdvantageInput(torch.randn(4), torch.arange(4) // 2), PrefixTEAParams(n=8))


def test_prefix_tea_binary_rewards_lone_success_and_mostly_correct():
    # 1 success of 8, N = 16 > m: the success's others are all 0 (leave-one-out sd = 0);
    # scoring against the degenerate tail gave the success -5e-9. With the group-std
    # fallback it gets the largest advantage, +0.307 (TEA: +0.238), failures -0.044 each
    one = torch.tensor([1.0] + [0.0] * 7)
    out = adv("prefix_tea", one, None, n=16)
    assert int(out.argmax()) == 0 and out[0] > 0.2, out
    assert_close(out[1:], torch.full((7,), -float(out[0]) / 7))
    tea_one = adv("tea", one, None, n=16)
    assert 0.5 < float(out[0] / tea_one[0]) < 2.0
    # 7 of 8 correct: the failure's others are all 1 (the fallback again). Under best-of-16
    # such a prompt is nearly solved, so the signal is small, but it has the right signs
    # and TEA's size (+6.2e-6 each, -4.35e-5 for the failure; TEA +5.4e-6, -3.8e-5),
    # far above rounding, and unit scale with the std scaling (-2.34)
    seven = torch.tensor([1.0] * 7 + [0.0])
    out = adv("prefix_tea", seven, None, n=16)
    tea_seven = adv("tea", seven, None, n=16)
    assert (out[:7] > 1e-6).all() and out[7] < -1e-5, out
    assert 0.5 < float(out[7] / tea_seven[7]) < 2.0
    scaled = adv("prefix_tea", seven, None, n=16, scale_by_std=True)
    assert scaled[7] < -2.0 and (scaled[:7] > 0.3).all(), scaled


def test_validation_and_presets():
    with pytest.raises(ValueError, match="n"):
        ADVANTAGES.build("tea", n=0)
    assert get_preset("tea").catalog_id == "001-02"
    assert get_preset("prefix_tea").advantage.name == "prefix_tea"
