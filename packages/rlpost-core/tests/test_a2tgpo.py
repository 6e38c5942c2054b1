"""A²TGPO (catalog 001-15): turn-group IG normalisation, variance-rescaled accumulation,
adaptive turn-level clipping, and the ``ppo_clip_turn`` objective that consumes it."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import (
    ADVANTAGES,
    OBJECTIVES,
    AdvantageInput,
    ObjectiveInput,
    PolicyBatch,
    RegistryError,
    get_preset,
)

NAN = float("nan")


def a2tgpo(rewards, groups, mask, turn_ids, ig, **params):
    inp = AdvantageInput(
        torch.as_tensor(rewards, dtype=torch.float32),
        torch.as_tensor(groups),
        torch.as_tensor(mask, dtype=torch.float32),
        turn_ids=torch.as_tensor(turn_ids),
        turn_rewards=torch.as_tensor(ig, dtype=torch.float32),
    )
    return ADVANTAGES.build("a2tgpo", **params)(inp)


# one prompt, three trajectories: a has turns 0, 1; b has 0, 1, 2; c has turn 0 only.
# -1: tool-output tokens (mask 1) and padding (mask 0). IG of absent turns is NaN / junk.
TURN_IDS = [
    [0, 0, -1, 1, 1, -1, -1],
    [0, -1, 1, -1, 2, 2, -1],
    [0, 0, 0, -1, -1, -1, -1],
]
MASK = [
    [1, 1, 1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 0],
    [1, 1, 1, 0, 0, 0, 0],
]
IG = [[1.0, 2.0, NAN], [3.0, 4.0, 5.0], [2.0, NAN, 7.0]]  # c's 7.0: turn 2 has no token


def test_hand_worked_example():
    # (i) turn 0: {1, 3, 2} mean 2, std 1 -> z = -1, 1, 0; turn 1: {2, 4} mean 3,
    #     std sqrt 2 -> z = -1/sqrt2, +1/sqrt2; turn 2: {5} singleton -> 0
    # (ii) gamma = 1: a0 = (-1 - 0.7071)/sqrt2 = -1.2071, a1 = -0.7071,
    #      b0 = (1 + 0.7071 + 0)/sqrt3 = 0.9856, b1 = (0.7071 + 0)/sqrt2 = 0.5, b2 = 0, c0 = 0
    # outcome: rewards 1, 0, 0.5 -> GRPO 1, -1, 0; weight 0.5 adds +0.5, -0.5, 0
    out = a2tgpo([1.0, 0.0, 0.5], [0, 0, 0], MASK, TURN_IDS, IG, outcome_weight=0.5)
    r2, r3 = math.sqrt(2), math.sqrt(3)
    a0, a1 = (-1 - 1 / r2) / r2 + 0.5, -1 / r2 + 0.5
    b0, b1, b2 = (1 + 1 / r2) / r3 - 0.5, (1 / r2) / r2 - 0.5, -0.5
    expected = torch.tensor(
        [
            [a0, a0, 0, a1, a1, 0, 0],
            [b0, 0, b1, 0, b2, b2, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ]
    )
    assert_close(out.advantages, expected, rtol=1e-5, atol=1e-5)
    # (iii) eps = 0.1 + 0.2 tanh|z|: |z| = 1 -> 0.25232, 1/sqrt2 -> 0.22178, 0 -> 0.1
    e1, eh, e0 = 0.1 + 0.2 * math.tanh(1.0), 0.1 + 0.2 * math.tanh(1 / r2), 0.1
    expected_clip = torch.tensor(
        [
            [e1, e1, 0, eh, eh, 0, 0],
            [e1, 0, eh, 0, e0, e0, 0],
            [e0, e0, e0, 0, 0, 0, 0],
        ]
    )
    assert_close(out.clip_range, expected_clip, rtol=1e-5, atol=1e-6)
    assert out.metrics["turn_groups"] == 3.0 and out.metrics["turns_per_traj"] == 2.0


def _layout(depths: torch.Tensor, U: int):
    """Turn u's policy token at 2u, a tool-output token (-1) at 2u + 1; T = 2U."""
    pos = torch.arange(2 * U)
    turn_ids = torch.where(pos % 2 == 0, pos // 2, -1).expand(len(depths), -1).clone()
    mask = (pos[None, :] < 2 * depths[:, None]).float()
    return turn_ids, mask


def test_normalisation_only_within_prompt_and_turn_index_groups():
    g = torch.Generator().manual_seed(1)
    B, U = 12, 3
    groups = torch.arange(B) // 6  # two prompts of six trajectories
    depths = torch.tensor([3, 3, 2, 3, 1, 3] * 2)
    turn_ids, mask = _layout(depths, U)
    ig = torch.randn(B, U, generator=g) * torch.tensor([100.0, 1.0, 0.01])  # scale per turn
    kw = {"gamma": 0.8, "outcome_weight": 0.0, "eps": 1e-9}  # eps: invariance is up to eps/std
    base = a2tgpo(torch.zeros(B), groups, mask, turn_ids, ig, **kw)
    # any increasing affine map per (prompt, turn) group leaves every output unchanged
    a = torch.tensor([[3.0, 0.2, 50.0], [1e-3, 7.0, 1.0]])[groups]
    b = torch.tensor([[-5.0, 10.0, 0.01], [2.0, -3.0, 0.5]])[groups]  # float32-safe
    moved = a2tgpo(torch.zeros(B), groups, mask, turn_ids, a * ig + b, **kw)
    assert_close(moved.advantages, base.advantages, rtol=1e-4, atol=1e-4)
    assert_close(moved.clip_range, base.clip_range, rtol=1e-4, atol=1e-5)
    # despite IG scales 100 / 1 / 0.01 per turn, |z| is comparable across turn positions
    z_abs = torch.stack([base.advantages[:, 2 * u].abs().mean() for u in range(U)])
    assert z_abs.max() / z_abs.min() < 3
    # changing one trajectory's turn-1 IG in prompt 0 moves only the (prompt 0, turn 1) group:
    # clip ranges (functions of each turn's own z) elsewhere stay bit-identical
    ig2 = ig.clone()
    ig2[0, 1] += 10.0
    other = a2tgpo(torch.zeros(B), groups, mask, turn_ids, ig2, **kw)
    same = torch.ones(B, 2 * U, dtype=torch.bool)
    same[:6, 2] = False  # prompt 0, turn-1 token
    assert torch.equal(other.clip_range[same], base.clip_range[same])
    assert not torch.equal(other.clip_range[:6, 2], base.clip_range[:6, 2])


def _depth_batch(gamma: float, rescale: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n_prompts, per_prompt, U = 32, 128, 8
    B = n_prompts * per_prompt
    groups = torch.arange(B) // per_prompt
    depths = torch.randint(1, U + 1, (B,), generator=g)
    turn_ids, mask = _layout(depths, U)
    # iid IG with a heterogeneous mean and scale per turn position
    ig = torch.randn(B, U, generator=g) * torch.logspace(-1, 1, U) + torch.arange(U) * 3.0
    out = a2tgpo(
        torch.zeros(B),
        groups,
        mask,
        turn_ids,
        ig,
        gamma=gamma,
        outcome_weight=0.0,
        rescale=rescale,
    )
    acc = out.advantages[:, 0::2]  # [B, U]: the accumulated term of each turn
    n_terms = depths[:, None] - torch.arange(U)  # accumulated terms at turn u (if > 0)
    return acc, n_terms


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_advantage_magnitude_independent_of_trajectory_depth(gamma, record_result):
    acc, n_terms = _depth_batch(gamma, rescale=True)
    raw, _ = _depth_batch(gamma, rescale=False)
    rows = []
    for n in range(1, 9):  # by number of accumulated terms
        sel = n_terms == n
        assert abs(acc[sel].std().item() - 1.0) < 0.1, (n, acc[sel].std().item())
        expected = math.sqrt(sum(gamma ** (2 * k) for k in range(n)))
        assert abs(raw[sel].std().item() / expected - 1.0) < 0.1, (n, raw[sel].std().item())
        rows.append({"gamma": gamma, "n": n, "count": int(sel.sum()), "expected": expected})
        rows[-1] |= {"rescaled_std": acc[sel].std().item(), "plain_std": raw[sel].std().item()}
    for u in range(8):  # by turn position: the rescaled std stays ~1 at every position
        sel = n_terms[:, u] > 0
        assert abs(acc[sel, u].std().item() - 1.0) < 0.1, (u, acc[sel, u].std().item())
        rows.append({"gamma": gamma, "u": u, "rescaled_std": acc[sel, u].std().item()})
        rows[-1] |= {"plain_std": raw[sel, u].std().item()}
    record_result("a2tgpo_depth", rows, catalog_ids=["001-15"], config={"prompts": 32})
    if gamma == 1.0:  # the un-rescaled sum drifts with depth: sqrt(8) = 2.83 at 8 terms
        assert raw[n_terms == 8].std() > 2.5


def test_clip_range_monotone_in_abs_z_and_bounded():
    g = torch.Generator().manual_seed(2)
    B, U = 64, 4
    groups = torch.arange(B) // 16
    depths = torch.randint(1, U + 1, (B,), generator=g)
    turn_ids, mask = _layout(depths, U)
    ig = torch.randn(B, U, generator=g) ** 3  # heavy tails: |z| up to ~3.5
    # gamma = 0 and no outcome term: the turn advantage is z itself
    out = a2tgpo(torch.zeros(B), groups, mask, turn_ids, ig, gamma=0.0, outcome_weight=0.0,
                 eps_min=0.05, eps_max=0.4, clip_scale=0.5)  # fmt: skip
    valid = (turn_ids >= 0) & (mask > 0)
    z, eps = out.advantages[valid], out.clip_range[valid]
    order = z.abs().argsort()
    assert (eps[order].diff() >= 0).all(), "clip range must be non-decreasing in |z|"
    assert (eps >= 0.05).all() and (eps <= 0.4).all()
    assert_close(eps, 0.05 + 0.35 * torch.tanh(z.abs() / 0.5))
    assert eps.max() > 0.39 and eps.min() < 0.1  # the range is actually used
    assert (out.clip_range[~valid] == 0).all()


def _logps(B=4, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)  # ratios far enough to clip
    mask = (torch.arange(T) < torch.tensor([6, 4, 2, 5])[:, None]).float()
    return logp, old, mask, torch.randn(B, T, generator=g)


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_clip_turn_with_constant_clip_range_equals_ppo_clip(dual_clip):
    logp, old, mask, adv = _logps()
    ref = OBJECTIVES.build("ppo_clip", clip_low=0.2, clip_high=0.2, dual_clip=dual_clip)(
        ObjectiveInput(logp, old, adv, mask)
    )
    turn = OBJECTIVES.build("ppo_clip_turn", clip_low=0.9, clip_high=0.9, dual_clip=dual_clip)(
        ObjectiveInput(logp, old, adv, mask, clip_range=torch.full_like(mask, 0.2))
    )
    assert torch.equal(turn.loss, ref.loss)
    (g_ref,) = torch.autograd.grad(ref.loss.sum(), logp)
    (g_turn,) = torch.autograd.grad(turn.loss.sum(), logp)
    assert torch.equal(g_turn, g_ref)
    assert ref.metrics["clip_frac"] > 0  # the comparison exercises the clipped branch
    for k, v in ref.metrics.items():
        assert turn.metrics[k] == v, k
    # without clip_range it is ppo_clip with its own (here asymmetric) params
    fb = OBJECTIVES.build("ppo_clip_turn", clip_low=0.1, clip_high=0.28)(
        ObjectiveInput(logp, old, adv, mask)
    )
    asym = OBJECTIVES.build("ppo_clip", clip_low=0.1, clip_high=0.28)(
        ObjectiveInput(logp, old, adv, mask)
    )
    assert torch.equal(fb.loss, asym.loss)


def test_ppo_clip_turn_uses_each_tokens_clip_range():
    # ratio e^0.25 = 1.284, A = 1: eps 0.1 clips at 1.1 (loss -1.1, no gradient);
    # eps 0.3 keeps it (loss -1.284, d loss / d logp = -1.284)
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.full((1, 2), -0.25)
    inp = ObjectiveInput(
        logp, old, torch.ones(1, 2), torch.ones(1, 2), clip_range=torch.tensor([[0.1, 0.3]])
    )
    out = OBJECTIVES.build("ppo_clip_turn")(inp)
    r = math.exp(0.25)
    assert_close(out.loss, torch.tensor([[-1.1, -r]]))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(g, torch.tensor([[0.0, -r]]))
    assert out.metrics["clip_frac"] == 0.5 and out.metrics["clip_range_mean"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="clip_range shape"):
        ObjectiveInput(logp, old, torch.ones(1), torch.ones(1, 2), clip_range=torch.ones(2))
    with pytest.raises(ValueError, match="clip_range must be finite and >= 0"):
        OBJECTIVES.build("ppo_clip_turn")(
            ObjectiveInput(logp, old, torch.ones(1), torch.ones(1, 2), clip_range=-torch.ones(1, 2))
        )


def _preset_batch():
    B, U = 8, 3
    groups = torch.arange(B) // 4
    depths = torch.tensor([3, 2, 1, 3, 2, 3, 1, 2])
    turn_ids, mask = _layout(depths, U)
    g = torch.Generator().manual_seed(3)
    ig = torch.randn(B, U, generator=g)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    logp = (-torch.rand(B, 2 * U, generator=g) * 2).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(B, 2 * U, generator=g)
    inp = AdvantageInput(rewards, groups, mask, turn_ids=turn_ids, turn_rewards=ig)
    return inp, logp, old, mask, turn_ids


def test_masked_and_non_policy_tokens_get_zero_advantage_and_gradient():
    inp, logp, old, mask, turn_ids = _preset_batch()
    recipe = get_preset("a2tgpo").build()
    out = recipe.advantages(inp)
    policy = (turn_ids >= 0) & (mask > 0)
    assert (out.advantages[~policy] == 0).all() and (out.clip_range[~policy] == 0).all()
    loss = recipe.policy_loss(
        PolicyBatch(logp, old, out.advantages, mask, clip_range=out.clip_range)
    ).loss
    (g,) = torch.autograd.grad(loss, logp)
    assert (g[~policy] == 0).all(), "tool outputs and padding must get zero gradient"
    assert (g[policy] != 0).sum() >= policy.sum() // 2  # the policy tokens do learn


def test_recipe_passes_clip_range_and_token_weights_and_stays_backward_compatible():
    inp, logp, old, mask, _ = _preset_batch()
    recipe = get_preset("a2tgpo").build()
    out = recipe.advantages(inp)
    plain = recipe.policy_loss(PolicyBatch(logp, old, out.advantages, mask))
    same = recipe.policy_loss(
        PolicyBatch(logp, old, out.advantages, mask, clip_range=None, token_weights=None)
    )
    assert torch.equal(plain.loss, same.loss)
    turn = recipe.policy_loss(
        PolicyBatch(logp, old, out.advantages, mask, clip_range=out.clip_range)
    )
    assert turn.loss != plain.loss and "clip_range_mean" in turn.metrics
    # token weights multiply each token's policy-gradient contribution
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(4)) * 3
    (g1,) = torch.autograd.grad(turn.loss, logp)
    weighted = recipe.policy_loss(
        PolicyBatch(logp, old, out.advantages, mask, clip_range=out.clip_range, token_weights=w)
    )
    (gw,) = torch.autograd.grad(weighted.loss, logp)
    assert_close(gw, g1 * w)
    with pytest.raises(ValueError, match="token_weights must be"):
        recipe.policy_loss(PolicyBatch(logp, old, out.advantages, mask, token_weights=w[:, :2]))


def test_microbatching_with_per_token_clip_range_equals_full_batch():
    inp, logp, old, mask, _ = _preset_batch()
    recipe = get_preset("a2tgpo").build()
    out = recipe.advantages(inp)
    A, eps = out.advantages, out.clip_range
    full = recipe.policy_loss(PolicyBatch(logp, old, A, mask, clip_range=eps))
    (g_full,) = torch.autograd.grad(full.loss, logp)
    g_acc = torch.zeros_like(logp)
    for idx in ([0, 1, 2], [3, 4, 5, 6], [7]):
        x = logp.detach()[idx].clone().requires_grad_(True)
        li = recipe.policy_loss(
            PolicyBatch(
                x, old[idx], A[idx], mask[idx], clip_range=eps[idx], global_tokens=mask.sum().item()
            )
        ).loss
        g_acc[idx] += torch.autograd.grad(li, x)[0]
    assert_close(g_acc, g_full)


def test_without_turn_information_it_is_the_weighted_outcome_advantage():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 3)
    out = ADVANTAGES.build("a2tgpo", outcome_weight=2.0)(AdvantageInput(rewards, groups, mask))
    grpo = ADVANTAGES.build("grpo")(AdvantageInput(rewards, groups, mask)).advantages
    assert_close(out.advantages, 2.0 * grpo)
    assert_close(out.clip_range, torch.full((4, 3), 0.1))
    assert out.metrics["turn_groups"] == 0.0


def test_invalid_inputs_and_params_fail_naming_the_problem():
    tid = torch.tensor(TURN_IDS)
    m = torch.tensor(MASK, dtype=torch.float32)
    r, gid = torch.zeros(3), torch.zeros(3, dtype=torch.long)
    build = ADVANTAGES.build("a2tgpo")
    with pytest.raises(ValueError, match="both"):
        build(AdvantageInput(r, gid, m, turn_ids=tid))
    with pytest.raises(ValueError, match=r"needs AdvantageInput\.mask"):
        build(AdvantageInput(r, gid, turn_ids=tid, turn_rewards=torch.zeros(3, 3)))
    with pytest.raises(ValueError, match=r"turn_ids must be in \[-1, U\) with U=2"):
        build(AdvantageInput(r, gid, m, turn_ids=tid, turn_rewards=torch.zeros(3, 2)))
    bad = torch.tensor(IG)
    bad[0, 1] = NAN  # an existing turn
    with pytest.raises(ValueError, match="existing turns contain NaN"):
        build(AdvantageInput(r, gid, m, turn_ids=tid, turn_rewards=bad))
    with pytest.raises(RegistryError, match="eps_min <= eps_max"):
        ADVANTAGES.build("a2tgpo", eps_min=0.3, eps_max=0.2)
    with pytest.raises(RegistryError, match="gamma must be in"):
        ADVANTAGES.build("a2tgpo", gamma=1.5)
    with pytest.raises(RegistryError, match="clip_scale"):
        ADVANTAGES.build("a2tgpo", clip_scale=0.0)


def test_preset():
    p = get_preset("a2tgpo")
    assert p.catalog_id == "001-15" and p.objective.name == "ppo_clip_turn"
    assert p.advantage.name == "a2tgpo"
