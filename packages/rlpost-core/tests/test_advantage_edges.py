"""Edge cases of the advantage estimators, found by the mutation pass (tools/mutate_core.py).

Each test pins a property that a surviving mutant of ``rlpost.core.advantages`` broke
without any existing test noticing: a boundary of a comparison (n == m in Prefix-TEA,
two prompts in BASIS, a turn id below -1), a normaliser (RDPO's sqrt(#active), the mean
token gap of a step, the per-turn and per-token means in the metrics), a sign (GRPO's
lower clip bound, GCPO's unscaled centring) and the guards against division by zero
(RLOO's singleton groups, a zero initial entropy, a singleton turn group with eps = 0).
Expected values are worked by hand in the comments or computed by an independent
formulation written out in the test.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, TrainingDynamics
from rlpost.core.advantages.entropy import _draw_seed, fade_phase
from rlpost.core.advantages.steps import StepOPSDParams, step_opsd, step_scores
from rlpost.core.advantages.turns import turn_group_zscores

SQ2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------- classic


def test_grpo_clip_bounds_advantages_to_minus_clip_and_plus_clip():
    # Dr. GRPO: rewards [0, 1, 11], mean 4 -> A = [-4, -3, 7]; clip 3.5 -> [-3.5, -3, 3.5]
    r = torch.tensor([0.0, 1.0, 11.0])
    out = ADVANTAGES("grpo", AdvantageInput(r), scale_by_std=False, clip=3.5)
    assert_close(out.advantages, torch.tensor([-3.5, -3.0, 3.5]))


def test_rloo_singleton_group_with_zero_reward_gets_zero_advantage():
    # group 0 = {0.0} alone: no baseline sample -> A = 0 (finite, even for a zero reward);
    # group 1 = {1, 3}: A_i = r_i - r_other = -2, +2
    r, g = torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0, 1, 1])
    out = ADVANTAGES("rloo", AdvantageInput(r, g))
    assert_close(out.advantages, torch.tensor([0.0, -2.0, 2.0]))


# ----------------------------------------------------------------------------- best-of-N


def test_prefix_tea_gives_no_credit_when_n_equals_the_group_size():
    # N = m = 3: the only (N-1)-subset of the others is all of them, so
    # U_3(i) = max(r_i, max of the others) = the group maximum (3) for every i -> A = 0
    r = torch.tensor([0.0, 1.0, 3.0])
    out = ADVANTAGES("prefix_tea", AdvantageInput(r), n=3)
    assert_close(out.advantages, torch.zeros(3))


def _phi(t):
    return 0.5 * (1.0 + torch.erf(t / SQ2))


def _expected_excess_over_max(z, n, points=40001):
    """E[(z - M_{n-1})^+] = int_{-inf}^z Phi(t)^(n-1) dt for standard normal draws."""
    t = torch.linspace(-12.0, z, points, dtype=torch.float64)
    return float(torch.trapezoid(_phi(t) ** (n - 1), t))


def _prefix_tea_reference(r, groups, n):
    """Prefix-TEA for N > m, written out per response from its docstring: the others'
    mean and (unbiased) std, the group std when the others show no spread, the
    predictive scale s * sqrt(1 + 1/(m-1)), g_i = sigma_i E[(z_i - M_{N-1})^+]."""
    r = r.double()
    g = torch.zeros_like(r)
    for gid in groups.unique():
        idx = (groups == gid).nonzero().squeeze(1).tolist()
        m = len(idx)
        for i in idx:
            others = r[[j for j in idx if j != i]]
            s = float(others.std())
            if s == 0.0:
                s = float(r[idx].std())
            sigma = s * math.sqrt(1.0 + 1.0 / (m - 1))
            z = (float(r[i]) - float(others.mean())) / sigma
            g[i] = sigma * _expected_excess_over_max(z, n)
        g[idx] = g[idx] - g[idx].mean()
    return g


def test_prefix_tea_tail_fit_matches_leave_one_out_reference_at_a_small_reward_scale():
    # rewards on a 1e-4 scale: each response's leave-one-out spread (~1e-4) is real spread,
    # not rounding, so it is the scale used; group 1 is a lone success, whose others
    # (all 0) have no spread, so it falls back to the group std
    r = torch.tensor([0.0, 1e-4, 2e-4, 4e-4, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = ADVANTAGES("prefix_tea", AdvantageInput(r, groups), n=8)
    ref = _prefix_tea_reference(r, groups, 8).float()
    assert_close(out.advantages[:4], ref[:4], rtol=1e-4, atol=1e-10)
    assert_close(out.advantages[4:], ref[4:], rtol=1e-4, atol=1e-8)


# ----------------------------------------------------------------------------- cross-prompt


def test_basis_with_two_prompts_uses_the_other_prompts_reward_as_baseline():
    # B = 2 and uninformative (identical) features: the leave-one-out baseline of each
    # prompt is the other prompt's reward, V = [4, 1] -> A = [1 - 4, 4 - 1]
    r = torch.tensor([1.0, 4.0])
    f = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    out = ADVANTAGES("basis", AdvantageInput(r, prompt_features=f), ridge=1e-3)
    assert_close(out.advantages, torch.tensor([-3.0, 3.0]), rtol=0, atol=1e-5)


def test_basis_normalized_features_ignore_each_rows_norm():
    # rows [1, 1], [2, 2], [3, 3] all normalise to [1, 1] / sqrt(2): no signal, so the
    # baseline is the leave-one-out batch mean V = [(2+4)/2, (1+4)/2, (1+2)/2] = [3, 2.5, 1.5]
    r = torch.tensor([1.0, 2.0, 4.0])
    f = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    out = ADVANTAGES("basis", AdvantageInput(r, prompt_features=f), ridge=1e-3)
    assert_close(out.advantages, torch.tensor([-2.0, -0.5, 2.5]), rtol=0, atol=1e-5)


def test_basis_fit_r2_of_a_leave_one_out_mean_baseline_is_one_minus_inflation_squared():
    # r - LOO mean = n/(n-1) (r - mean), so R^2 = 1 - (n/(n-1))^2 = 1 - 2.25 = -1.25 (n = 3):
    # errors [-2, -0.5, 2.5] -> MSE 3.5; population variance of [1, 2, 4] = 14/9
    r = torch.tensor([1.0, 2.0, 4.0])
    f = torch.ones(3, 2)
    out = ADVANTAGES("basis", AdvantageInput(r, prompt_features=f), ridge=1e-3)
    assert out.metrics["value_fit_r2"] == pytest.approx(1.0 - 3.5 / (14.0 / 9.0), abs=1e-5)
    assert out.metrics["value_fit_r2"] == pytest.approx(-1.25, abs=1e-5)


def test_gcpo_without_std_scaling_is_dr_grpo_when_disagreement_is_uniform():
    # identical embeddings: u = 0 everywhere, slope 0, every weight 1 -> A = r - mean_g(r)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 1, 1])
    f = torch.tensor([[1.0, 0.0]] * 4)
    out = ADVANTAGES("gcpo", AdvantageInput(r, g, completion_features=f), scale_by_std=False)
    assert_close(out.advantages, torch.tensor([0.5, -0.5, 0.0, 0.0]))


# ----------------------------------------------------------------------------- entropy


def test_entrocraft_refuses_a_relative_schedule_when_initial_entropy_is_zero():
    # target = start * initial_entropy = 0: a relative entropy error is undefined
    inp = AdvantageInput(
        torch.tensor([1.0, 0.0]),
        logprobs=torch.tensor([[-1.0], [-2.0]]),
        dynamics=TrainingDynamics(progress=0.5, entropy=0.3, initial_entropy=0.0),
    )
    with pytest.raises(ValueError, match="target entropy is 0"):
        ADVANTAGES("entrocraft", inp)


def test_entrocraft_rejects_exactly_the_wrong_way_responses_whose_draw_is_below_q():
    # rewards 0..5, log-prob deviations = reward deviations -> c_i = (r_i - 2.5) A_i > 0 for
    # all: every response lowers the entropy. H = 0.1 < H* = (1 - 0.2 * 0.25) * 1 = 0.95, so
    # all are "wrong way" and each is rejected iff its uniform u_i < q. With gain 10, q is
    # capped at p_max, set to one of the draws itself: that response (u == q) is kept.
    r = torch.arange(6, dtype=torch.float32)
    dyn = TrainingDynamics(progress=0.25, entropy=0.1, initial_entropy=1.0)
    gen = torch.Generator(device="cpu").manual_seed(_draw_seed(0, 0.25))
    u = torch.rand(6, generator=gen, dtype=torch.float64)
    q = float(u.sort().values[3])  # three draws below q, one equal, two above
    inp = AdvantageInput(r, logprobs=(r - 6.0)[:, None], dynamics=dyn)
    out = ADVANTAGES("entrocraft", inp, gain=10.0, p_max=q, seed=0)
    grpo = (r - 2.5) / (math.sqrt(17.5 / 5) + 1e-6)  # unbiased std of 0..5 = sqrt(3.5)
    keep = (u >= q).float()
    assert_close(out.advantages, grpo * keep)
    assert out.metrics["entrocraft_rejected_frac"] == pytest.approx(3 / 6)


def test_fade_phase_is_pure_exploitation_when_initial_entropy_is_zero():
    # no initial entropy to drop from: e = 0, not a division by zero
    assert fade_phase(TrainingDynamics(entropy=0.0, initial_entropy=0.0), 0.3) == 0.0
    assert fade_phase(TrainingDynamics(entropy=0.5, initial_entropy=0.0), 0.3) == 0.0


# ----------------------------------------------------------------------------- shaping


def test_icr_bonus_goes_to_the_shortest_correct_response_even_when_a_wrong_one_is_shorter():
    # lengths [1, 2, 3, 9], correct [0, 1, 1, 0]: mean length 3.75,
    # cov = sum (len - 3.75)(c - 0.5) = -2.5 < 0 (overthinking). The shortest response
    # (len 1) is wrong; the shortest *correct* one (len 2) gets +coef.
    # Dr. GRPO: A = [-0.5, 0.5, 0.5, -0.5] -> [-0.5, 0.6, 0.5, -0.5]
    lengths = torch.tensor([1, 2, 3, 9])
    mask = (torch.arange(9) < lengths[:, None]).float()
    r = torch.tensor([0.0, 1.0, 1.0, 0.0])
    out = ADVANTAGES("icr", AdvantageInput(r, mask=mask), coef=0.1, scale_by_std=False)
    assert_close(out.advantages[:, 0], torch.tensor([-0.5, 0.6, 0.5, -0.5]))
    assert out.metrics["icr_targets"] == 1.0


def test_soft_pair_grpo_std_scaling_divides_by_std_plus_eps():
    # rewards [0, 1]: win rates minus 1/2 = [-0.5, 0.5], unbiased std sqrt(0.5);
    # with eps = 1: A = +-0.5 / (sqrt(0.5) + 1)
    r = torch.tensor([0.0, 1.0])
    out = ADVANTAGES("soft_pair_grpo", AdvantageInput(r), scale_by_std=True, eps=1.0)
    a = 0.5 / (math.sqrt(0.5) + 1.0)
    assert_close(out.advantages, torch.tensor([-a, a]))


# ----------------------------------------------------------------------------- turns, stages


def test_turn_ids_below_minus_one_are_rejected():
    # -1 marks a non-policy token; anything lower is malformed input
    inp = AdvantageInput(
        torch.tensor([1.0, 0.0]),
        mask=torch.ones(2, 3),
        turn_ids=torch.tensor([[0, -2, 1], [0, 1, 1]]),
        turn_rewards=torch.tensor([[0.5, 1.0], [0.2, 0.3]]),
    )
    with pytest.raises(ValueError, match="turn_ids must be in"):
        ADVANTAGES("a2tgpo", inp)
    with pytest.raises(ValueError, match="turn_ids must be in"):
        ADVANTAGES("stage_grpo", inp)


def test_turn_zscore_of_a_lone_trajectory_is_zero_even_with_zero_eps():
    # turn 0 is reached by both trajectories: IG [1, 3] -> mean 2, std sqrt(2), z = -+1/sqrt(2);
    # turn 1 only by trajectory 0: a singleton group -> z = 0 (not 0 / (0 + eps))
    ig = torch.tensor([[1.0, 5.0], [3.0, float("nan")]])
    exists = torch.tensor([[True, True], [True, False]])
    tz = turn_group_zscores(ig, exists, None, eps=0.0)
    assert_close(tz.z, torch.tensor([[-1 / SQ2, 0.0], [1 / SQ2, 0.0]]))
    assert_close(tz.group_size, torch.tensor([[2.0, 1.0], [2.0, 0.0]]))


def test_a2tgpo_adv_abs_mean_averages_over_existing_turns_only():
    # trajectory 0 has turns 0 and 1, trajectory 1 only turn 0 (slot 1 absent).
    # outcome GRPO of rewards [0, 1]: -+0.5 / sqrt(0.5) = -+1/sqrt(2) =: -+o
    # z: turn 0 IG [1, 3] -> -+1/sqrt(2); turn 1 singleton -> 0
    # S (gamma 1, rescaled): traj 0: S_0 = (-1/sqrt(2) + 0) / sqrt(2) = -0.5, S_1 = 0;
    #                        traj 1: S_0 = +1/sqrt(2)
    # A: traj 0 = [-0.5 - o, -o], traj 1 = [1/sqrt(2) + o] = [sqrt(2)]
    # adv_abs_mean = (0.5 + o + o + sqrt(2)) / 3 existing turns
    o = 1 / SQ2
    inp = AdvantageInput(
        torch.tensor([0.0, 1.0]),
        torch.tensor([0, 0]),
        mask=torch.ones(2, 4),
        turn_ids=torch.tensor([[0, 0, 1, 1], [0, 0, -1, -1]]),
        turn_rewards=torch.tensor([[1.0, 5.0], [3.0, 0.0]]),
    )
    out = ADVANTAGES("a2tgpo", inp)
    a0, a1, b0 = -0.5 - o, -o, SQ2
    expect = torch.tensor([[a0, a0, a1, a1], [b0, b0, 0.0, 0.0]])
    assert_close(out.advantages, expect, rtol=1e-5, atol=1e-5)
    assert out.metrics["adv_abs_mean"] == pytest.approx((0.5 + 2 * o + SQ2) / 3, abs=1e-5)


def test_stage_grpo_adv_abs_mean_is_the_mean_over_valid_policy_tokens():
    # rewards [0, 1] -> outcome -+1/sqrt(2); each turn is its own stage, stage scores
    # turn 0 [1, 3], turn 1 [0, 2] -> z = -+1/sqrt(2) in both; token A = -+sqrt(2).
    # 7 valid policy tokens (one -1 token), all |A| = sqrt(2) -> mean sqrt(2)
    inp = AdvantageInput(
        torch.tensor([0.0, 1.0]),
        torch.tensor([0, 0]),
        mask=torch.ones(2, 4),
        turn_ids=torch.tensor([[0, 0, 1, -1], [0, 1, 1, 1]]),
        turn_rewards=torch.tensor([[1.0, 0.0], [3.0, 2.0]]),
    )
    out = ADVANTAGES("stage_grpo", inp)
    expect = torch.tensor([[-SQ2, -SQ2, -SQ2, 0.0], [SQ2, SQ2, SQ2, SQ2]])
    assert_close(out.advantages, expect, rtol=1e-5, atol=1e-5)
    assert out.metrics["adv_abs_mean"] == pytest.approx(SQ2, abs=1e-5)


# ----------------------------------------------------------------------------- steps


def test_step_scores_are_the_mean_token_gap_of_each_step():
    # step 0: gaps 1, 2, 6 -> mean 3 over 3 tokens; step 1: gap 4 (1 token); the -1 token
    # (gap 100) belongs to no step
    gap = torch.tensor([[1.0, 2.0, 6.0, 4.0, 100.0]])
    tid = torch.tensor([[0, 0, 0, 1, -1]])
    d, count = step_scores(gap, tid, tid >= 0, 2)
    assert_close(d, torch.tensor([[3.0, 4.0]]))
    assert_close(count, torch.tensor([[3.0, 1.0]]))


def _two_step_input():
    # Dr. GRPO outcome of rewards [1, 0]: A = [+0.5, -0.5]
    # traj 0: steps of 2 + 2 tokens, gaps (teacher - student) [1, 1 | 0, 0] -> d = [1, 0]
    # traj 1: steps of 1 + 3 tokens, gaps [2 | 0, 0, 0] -> d = [2, 0]
    tid = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    return AdvantageInput(
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        mask=torch.ones(2, 4),
        turn_ids=tid,
        logprobs=torch.full((2, 4), -1.0),
        teacher_logprobs=torch.tensor([[0.0, 0.0, -1.0, -1.0], [1.0, -1.0, -1.0, -1.0]]),
    )


def test_step_opsd_centres_step_credit_on_the_trajectorys_mean_step_score():
    # d centred on its own trajectory's mean step score: traj 0 [0.5, -0.5], traj 1 [1, -1]
    # -> credit c = [+1, -1] (max-normalised, up to eps) in both.
    # traj 0 (A > 0): s = clip([+1, -1], 0.9) = [0.9, -0.9]; raw = 1 + 0.5 s = [1.45, 0.55];
    #   token-weighted mean (2 * 1.45 + 2 * 0.55) / 4 = 1 -> f = [1.45, 0.55]
    # traj 1 (A < 0): s = [-0.9, +0.9]; raw = [0.55, 1.45];
    #   token-weighted mean (0.55 + 3 * 1.45) / 4 = 1.225 -> f = [0.55, 1.45] / 1.225
    p = StepOPSDParams(alpha_clip=0.9, lambda_mix=0.5, scale_by_std=False)
    out = step_opsd(_two_step_input(), p)
    f1 = [0.55 / 1.225, 1.45 / 1.225]
    expect = torch.tensor(
        [
            [0.5 * 1.45, 0.5 * 1.45, 0.5 * 0.55, 0.5 * 0.55],
            [-0.5 * f1[0], -0.5 * f1[1], -0.5 * f1[1], -0.5 * f1[1]],
        ]
    )
    assert_close(out.advantages, expect)
    # the credit budget: each trajectory's summed token advantage is 4 A
    assert_close(out.advantages.sum(1), torch.tensor([2.0, -2.0]))


def test_step_opsd_factor_spread_is_the_mean_of_max_minus_min_step_factor():
    # factors (see above): traj 0 [1.45, 0.55] -> 0.9; traj 1 [0.55, 1.45] / 1.225 -> 0.9 / 1.225
    p = StepOPSDParams(alpha_clip=0.9, lambda_mix=0.5, scale_by_std=False)
    out = step_opsd(_two_step_input(), p)
    expect = (0.9 + 0.9 / 1.225) / 2
    assert out.metrics["step_factor_spread"] == pytest.approx(expect, abs=1e-5)


# ----------------------------------------------------------------------------- vector


def test_rdpo_divides_the_aggregate_by_sqrt_of_the_active_component_count():
    # two binary components over one group of 3: R = [[1, 0], [0, 1], [0, 0]].
    # Step 1 (binary: r - mean): X = [[2/3, -1/3], [-1/3, 2/3], [-1/3, -1/3]].
    # Step 2: Sigma = X^T X / 3 = [[2/9, -1/9], [-1/9, 2/9]]; (1, 1) is an eigenvector
    # with eigenvalue 1/9, so Z @ (1, 1) = X Sigma^(-1/2) (1, 1) = 3 X (1, 1) = [1, 1, -2].
    # Step 3: two active components -> divided by sqrt(2)
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    plain = ADVANTAGES("rdpo", AdvantageInput(R), normalize_by_active=False)
    assert_close(plain.advantages, torch.tensor([1.0, 1.0, -2.0]), rtol=1e-5, atol=1e-5)
    out = ADVANTAGES("rdpo", AdvantageInput(R))
    assert_close(out.advantages, torch.tensor([1.0, 1.0, -2.0]) / SQ2, rtol=1e-5, atol=1e-5)
