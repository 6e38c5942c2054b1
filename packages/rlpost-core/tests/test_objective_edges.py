"""Edge cases of the policy objectives, policy ratios and importance corrections.

These tests came out of a mutation-testing pass (``tools/mutate_core.py``) over
``rlpost.core.objectives`` and ``rlpost.core.ratios``: each one pins a property that a
surviving mutant broke. The properties are:

* closed intervals at their edges: a ratio exactly on a clip / mask / filter bound is
  inside (``sao``, ``mis``, ``ftis``, ``clipped_is``, Mu-GRPO's trigger band), and a
  diagnostic counts only what is strictly beyond a bound (``tis``, ``hard_pair_grpo``);
* sign and scale of the loss values and gradients (``is_pg``, ``cispo``'s lower clip,
  ``implicit_pessimism``'s k3 anchor);
* "strictly negative" / "strictly positive" advantage sets (Mu-GRPO's veto, ConSPO's
  negatives, UP's positive branch);
* numerics: the group max shift keeps ConSPO / LPO finite when scores / tau or A / beta
  leave float32's exp range; RIPO's bounds stay finite for a log-prob rounded above 0;
* metrics against hand values (LPO's divergence and TV to target over the real groups,
  ConSPO's score gap, RIPO's ratio width, the predictive mask's disagreement rate with
  padding, the cumulative ratio's largest log-ratio).

Every expected value is worked out by hand in the comments (or by a closed form written
out in the test), never taken from the library's output.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import (
    CORRECTIONS,
    OBJECTIVES,
    RATIOS,
    ObjectiveInput,
    RatioInput,
    TokenDistributions,
)
from rlpost.core.objectives.group import first_trigger, veto_keep_mask
from rlpost.core.objectives.offpolicy import fisher_rao_ratio_bounds

torch.set_num_threads(1)
E = math.e


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def run(name, log_ratio, adv, mask=None, weights=None, group_ids=None, **params):
    """Objective on a batch whose old log-probs are 0 (so logp == log_ratio); returns
    (output, d sum(loss) / d logp)."""
    logp = torch.tensor(log_ratio, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    out = OBJECTIVES.build(name, **params)(
        ObjectiveInput(
            logp,
            torch.zeros_like(logp),
            torch.tensor(adv),
            mask,
            weights=weights,
            group_ids=group_ids,
        )
    )
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    return out, g


# ------------------------------------------------------------------ clipped objectives


def test_cispo_clip_low_floors_the_weight_of_low_ratio_tokens():
    # ratios 0.5, 1, 2 with A = 1, clip [1 - 0.2, 1 + 0.28] = [0.8, 1.28]:
    # weights sg(clip(r)) = 0.8, 1, 1.28; d(-w A log pi)/d log pi = -0.8, -1, -1.28
    lr = [[math.log(0.5), 0.0, math.log(2.0)]]
    out, g = run("cispo", lr, [[1.0, 1.0, 1.0]], clip_low=0.2, clip_high=0.28)
    assert_close(g, torch.tensor([[-0.8, -1.0, -1.28]]))
    assert_close(out.loss, torch.tensor([[-0.8 * math.log(0.5), 0.0, -1.28 * math.log(2.0)]]))
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)


def test_hard_pair_constraint_frac_counts_only_targets_beyond_delta():
    # eta = 0.5, delta = 0.25, A = 0.5, 1.0, 0.2: eta A = 0.25 (on the edge, not clipped),
    # 0.5 (clipped to 0.25), 0.1; tau = 0.25, 0.25, 0.1
    # at log r = 0: loss = (0 - tau)^2 / 2 = 0.03125, 0.03125, 0.005; grad = log r - tau
    out, g = run("hard_pair_grpo", [[0.0, 0.0, 0.0]], [[0.5, 1.0, 0.2]], eta=0.5, delta=0.25)
    assert_close(out.loss, torch.tensor([[0.03125, 0.03125, 0.005]]))
    assert_close(g, torch.tensor([[-0.25, -0.25, -0.1]]))
    assert out.metrics["target_at_constraint_frac"] == pytest.approx(1 / 3)
    assert out.metrics["fit_error"] == pytest.approx((0.25 + 0.25 + 0.1) / 3)


def test_is_pg_loss_and_gradient_are_minus_weight_ratio_advantage():
    # r = e^0.5, e^-0.5; A = 2, -1; w = 0.5, 2
    # loss = -w r A = -0.5 e^0.5 2 = -e^0.5,  -2 e^-0.5 (-1) = 2 e^-0.5
    # d loss / d log pi = -w r A (the same values)
    w = torch.tensor([[0.5, 2.0]])
    out, g = run("is_pg", [[0.5, -0.5]], [[2.0, -1.0]], weights=w)
    expected = torch.tensor([[-math.exp(0.5), 2 * math.exp(-0.5)]])
    assert_close(out.loss, expected)
    assert_close(g, expected)
    assert out.metrics["ratio_mean"] == pytest.approx(math.cosh(0.5))


# ------------------------------------------------------------------ group objectives


def test_first_trigger_ignores_masked_tokens():
    # band [0.5, 2]: ratio 3 leaves it. Row 0: the masked token 0 is skipped, the first
    # valid one outside is token 2. Row 1: only the masked token is outside -> -1.
    lr = torch.tensor([[math.log(3.0), 0.0, math.log(3.0), 0.0], [math.log(3.0), 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    assert first_trigger(lr, mask, 0.5, 2.0).tolist() == [2, -1]


def test_ratio_on_the_band_edge_is_not_a_mu_grpo_trigger():
    # clip_low = 0 gives the band [1, 2]; on-policy tokens have r = 1, on its closed
    # lower edge, so nothing leaves the band: no trigger, no veto of the negative row
    lr = torch.zeros(1, 3)
    assert first_trigger(lr, torch.ones(1, 3), 1.0, 2.0).tolist() == [-1]
    out, _ = run("mu_grpo", [[0.0, 0.0, 0.0]], [-1.0], clip_low=0.0, clip_high=1.0)
    assert out.metrics["veto_frac"] == 0.0
    assert out.metrics["trigger_frac"] == 0.0
    assert_close(out.loss, torch.tensor([[1.0, 1.0, 1.0]]))  # -r A = 1 on every token


def test_zero_mean_advantage_response_is_not_vetoed():
    # token advantages (1, -1): the response's (masked mean) advantage is 0, not < 0, so a
    # trigger at token 0 vetoes nothing; at r = 1 the gradient is -r A = (-1, 1)
    keep = veto_keep_mask(torch.tensor([0]), torch.tensor([0.0]), torch.ones(1, 2))
    assert torch.equal(keep, torch.ones(1, 2))
    logp = torch.zeros(1, 2, requires_grad=True)
    inp = ObjectiveInput(
        logp,
        torch.zeros(1, 2),
        torch.tensor([[1.0, -1.0]]),
        torch.ones(1, 2),
        trigger_pos=torch.tensor([0]),
    )
    out = OBJECTIVES.build("mu_grpo")(inp)
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(g, torch.tensor([[-1.0, 1.0]]))
    assert out.metrics["veto_frac"] == 0.0


def test_conspo_zero_advantage_response_is_not_a_negative():
    # one group: positive (A = 1, s = -1), negative (A = -1, s = -2), zero (A = 0, s = -0.5);
    # tau = 1, margin 0. Only the negative is a distractor:
    #   L_pos = log(e^-1 + e^-2) - (-1) = log(1 + e^-1)
    #   dL/ds_pos = -(1 - e^-1 / (e^-1 + e^-2)) = -e^-1 / (1 + e^-1)
    #   dL/ds_neg = e^-2 / (e^-1 + e^-2) = e^-1 / (1 + e^-1);  the zero row: 0
    # (one token per response, so s_i = log pi of that token)
    out, g = run(
        "conspo",
        [[-1.0], [-2.0], [-0.5]],
        [1.0, -1.0, 0.0],
        group_ids=torch.tensor([0, 0, 0]),
        tau=1.0,
    )
    k = math.exp(-1) / (1 + math.exp(-1))
    assert_close(out.loss, torch.tensor([[math.log(1 + math.exp(-1))], [0.0], [0.0]]))
    assert_close(g, torch.tensor([[-k], [k], [0.0]]))
    assert out.metrics["score_gap"] == pytest.approx(1.0)  # s_pos - s_neg = -1 - (-2)
    assert out.metrics["pos_prob"] == pytest.approx(1 / (1 + math.exp(-1)))
    assert out.metrics["contrast_frac"] == pytest.approx(1 / 3)


def test_conspo_is_finite_when_scores_over_tau_underflow():
    # tau = 0.01, s_pos = s_neg = -2: z = s / tau = -200, and e^-200 is 0 in float32.
    # Shifted by the group max, L_pos = tau (log(e^z + e^z) - z) = tau log 2,
    # dL/ds_pos = -(1 - 1/2) = -1/2, dL/ds_neg = 1/2
    out, g = run("conspo", [[-2.0], [-2.0]], [1.0, -1.0], group_ids=torch.tensor([0, 0]), tau=0.01)
    assert_close(out.loss, torch.tensor([[0.01 * math.log(2)], [0.0]]))
    assert_close(g, torch.tensor([[-0.5], [0.5]]))


def test_lpo_metrics_average_over_the_real_groups():
    # on-policy (l = 0): q = (1/2, 1/2) in both groups; beta = 1. Group 0: A = (1, -1),
    # group 1: A = (2, 0); both give p* = softmax(A) = (s, 1 - s), s = sigmoid(2).
    # forward KL D = s log(2 s) + (1 - s) log(2 (1 - s)) in each group, so the mean over the
    # two groups is D; TV(q, p*) = (|1/2 - s| + |1/2 - (1 - s)|) / 2 = s - 1/2.
    # Gradient: d loss / d l_i = n_g beta (q_i - p*_i) summed over the row's 2 tokens,
    # d l_i / d log pi_it = 1/2, so per token n_g (q_i - p*_i) = 2 (1/2 - s) = 1 - 2 s.
    s = sigmoid(2.0)
    d = s * math.log(2 * s) + (1 - s) * math.log(2 * (1 - s))
    out, g = run(
        "lpo", [[0.0, 0.0]] * 4, [1.0, -1.0, 2.0, 0.0], group_ids=torch.tensor([0, 0, 1, 1])
    )
    assert out.metrics["lpo_divergence"] == pytest.approx(d, rel=1e-5)
    assert out.metrics["lpo_tv_to_target"] == pytest.approx(s - 0.5, rel=1e-5)
    assert out.metrics["lpo_grad_abs_max"] == pytest.approx(s - 0.5, rel=1e-5)
    assert_close(g, torch.tensor([[1 - 2 * s] * 2, [2 * s - 1] * 2] * 2))


def test_lpo_is_finite_for_a_sharp_target():
    # beta = 0.01: A / beta = (100, -100), e^100 overflows float32. Shifted by the group
    # max, p* = (1, e^-200) = (1, 0); q = (1/2, 1/2): D = 1 log(1 / (1/2)) = log 2,
    # TV = 1/2, d loss / d log pi_it = beta n_g (q_i - p*_i) = 0.01 * 2 (-1/2, 1/2)
    out, g = run("lpo", [[0.0], [0.0]], [1.0, -1.0], group_ids=torch.tensor([0, 0]), beta=0.01)
    assert out.metrics["lpo_divergence"] == pytest.approx(math.log(2))
    assert out.metrics["lpo_tv_to_target"] == pytest.approx(0.5)
    assert_close(g, torch.tensor([[-0.01], [0.01]]))


# ------------------------------------------------------------------ off-policy objectives


def test_implicit_pessimism_loss_is_k3_anchor_minus_pessimistic_surrogate():
    # beta = 2, log r = 0.5, r = e^0.5; k3 = r - 1 - log r
    #   A = 1:  loss = beta k3 - A log r        grad = beta (r - 1) - A
    #   A = 0:  loss = beta k3                  grad = beta (r - 1)
    #   A = -1: loss = beta k3 - A (r - 1)      grad = beta (r - 1) - A r
    r = math.exp(0.5)
    k3 = r - 1 - 0.5
    out, g = run("implicit_pessimism", [[0.5, 0.5, 0.5]], [[1.0, 0.0, -1.0]], beta=2.0)
    assert_close(out.loss, torch.tensor([[2 * k3 - 0.5, 2 * k3, 2 * k3 + (r - 1)]]))
    assert_close(g, torch.tensor([[2 * (r - 1) - 1, 2 * (r - 1), 2 * (r - 1) + r]]))
    # on-policy the anchor and the surrogate are both 0, whatever A
    out, _ = run("implicit_pessimism", [[0.0, 0.0]], [[3.0, -3.0]])
    assert_close(out.loss, torch.zeros(1, 2))


def test_up_pos_beyond_clip_frac_counts_only_positive_advantages():
    # r = 2 > 1 + 0.28 on both tokens; A = 0 is on the clipped (A <= 0) branch, so only
    # the A = 1 token is a positive beyond the clip: 1/2.
    # A = 0: loss -min(2 * 0, 1.28 * 0) = 0, grad 0;  A = 1: loss -A = -1, grad -A = -1
    out, g = run("up", [[math.log(2.0), math.log(2.0)]], [[0.0, 1.0]])
    assert out.metrics["pos_beyond_clip_frac"] == pytest.approx(0.5)
    assert_close(out.loss, torch.tensor([[0.0, -1.0]]))
    assert_close(g, torch.tensor([[0.0, -1.0]]))


def test_ripo_bounds_for_a_log_prob_rounded_above_zero():
    # old log-prob 1e-6 (rounding noise above 0) is p = 1: phi = pi/2, so
    # hi = sin^2(pi/2) / 1 = 1 and lo = sin^2(pi/2 - delta) = cos^2(delta)
    old = torch.tensor([[1e-6, 1e-6]])
    lo, hi = fisher_rao_ratio_bounds(old, 0.1)
    assert_close(lo, torch.full((1, 2), math.cos(0.1) ** 2))
    assert_close(hi, torch.ones(1, 2))
    # r = e^0.5 with A = 1: min(r, 1) A = 1 -> loss -1; r = 0.5 with A = -1:
    # min(-0.5, -cos^2(0.1)) = -cos^2(0.1) -> loss cos^2(0.1); both clipped, gradient 0
    logp = (old + torch.tensor([[0.5, math.log(0.5)]])).requires_grad_(True)
    out = OBJECTIVES.build("ripo", delta=0.1)(
        ObjectiveInput(logp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    )
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(out.loss, torch.tensor([[-1.0, math.cos(0.1) ** 2]]))
    assert_close(g, torch.zeros(1, 2))


def test_ripo_ratio_width_at_half_probability():
    # p = 1/2: phi = pi/4, sin^2(pi/4 +- delta) = (1 +- sin 2 delta) / 2, so
    # hi - lo = 2 sin(2 delta) = 2 sin 0.2; the masked token (p = 0.2) is not averaged
    old = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = OBJECTIVES.build("ripo", delta=0.1)(
        ObjectiveInput(old.clone(), old, torch.tensor([1.0]), mask)
    )
    assert out.metrics["ratio_width_mean"] == pytest.approx(2 * math.sin(0.2), rel=1e-5)


def test_sao_box_is_closed_at_its_edges():
    # clip 0 / 0: the box is [1, 1]; r = 1 is inside (gradient -r A), r = e^0.1 is outside
    # (value -r A, gradient 0)
    out, g = run("sao", [[0.0, 0.0, 0.1]], [[1.0, -1.0, 1.0]], clip_low=0.0, clip_high=0.0)
    assert_close(out.loss, torch.tensor([[-1.0, 1.0, -math.exp(0.1)]]))
    assert_close(g, torch.tensor([[-1.0, 1.0, 0.0]]))
    assert out.metrics["clip_frac"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------ corrections


def engine_input(rho, mask=None):
    """RatioInput whose engine ratio pi_old / pi_rollout is ``rho`` (rollout log-probs 0)."""
    old = torch.tensor(rho).log()
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask)
    return RatioInput(old.clone(), old, mask, rollout_logp=torch.zeros_like(old))


def test_tis_counts_only_weights_the_cap_changes():
    # cap 1: rho = 1 (engines agree) keeps weight 1 untruncated; rho = 2 -> 1 (truncated);
    # rho = 0.5 stays 0.5. is_truncated_frac = 1/3
    out = CORRECTIONS.build("tis", cap=1.0)(engine_input([[1.0, 2.0, 0.5]]))
    assert_close(out.weights, torch.tensor([[1.0, 1.0, 0.5]]))
    assert out.metrics["is_truncated_frac"] == pytest.approx(1 / 3)


def test_mis_band_is_closed():
    # cap 1: the band [1/1, 1] keeps rho = 1 exactly (weight rho = 1), drops 2 and 0.5
    out = CORRECTIONS.build("mis", cap=1.0)(engine_input([[1.0, 2.0, 0.5]]))
    assert_close(out.mask, torch.tensor([[1.0, 0.0, 0.0]]))
    assert_close(out.weights, torch.tensor([[1.0, 0.0, 0.0]]))
    assert out.metrics["is_masked_frac"] == pytest.approx(2 / 3)


def test_ftis_keeps_a_ratio_equal_to_filter_low():
    # filter_low = 1, cap 2, token level: rho = 1 passes (a self-generated sample), 0.5 is
    # filtered, 3 passes and is truncated to 2
    out = CORRECTIONS.build("ftis", filter_low=1.0, cap=2.0, filter_level="token")(
        engine_input([[1.0, 0.5, 3.0]])
    )
    assert_close(out.mask, torch.tensor([[1.0, 0.0, 1.0]]))
    assert_close(out.weights, torch.tensor([[1.0, 0.0, 2.0]]))
    # sequence level: rho = (2, 1/2), geometric mean exp((log 2 - log 2) / 2) = 1 passes
    out = CORRECTIONS.build("ftis", filter_low=1.0, cap=2.0)(engine_input([[2.0, 0.5]]))
    assert_close(out.mask, torch.ones(1, 2))
    assert_close(out.weights, torch.tensor([[2.0, 0.5]]))


@pytest.mark.parametrize("rejected_weight", ["ratio", "unbiased"])
def test_sis_accepts_only_uniforms_strictly_below_the_acceptance_probability(
    monkeypatch, rejected_weight
):
    # M = 2; rho = e, e, e^-1 -> a = min(1, rho) / M = 1/2, 1/2, e^-1 / 2
    # uniforms u = 1/2, 1/4, 3/4: accept iff u < a (P(accept) = a exactly), so only token 1
    # "ratio": rejected w = rho;  "unbiased": w = (rho - a) / (1 - a)
    u = torch.tensor([[0.5, 0.25, 0.75]])
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: u.clone())
    logp = torch.tensor([[1.0, 1.0, -1.0]])
    inp = RatioInput(logp, torch.zeros(1, 3), torch.ones(1, 3))
    out = CORRECTIONS.build("sis", envelope=2.0, rejected_weight=rejected_weight)(inp)
    a2 = math.exp(-1) / 2
    if rejected_weight == "ratio":
        expected = [E, 1.0, math.exp(-1)]
    else:
        expected = [(E - 0.5) / 0.5, 1.0, (math.exp(-1) - a2) / (1 - a2)]
    assert_close(out.weights, torch.tensor([expected]))
    assert out.metrics["sis_accept_frac"] == pytest.approx(1 / 3)


def test_clipped_is_mask_high_drops_above_and_keeps_its_edge():
    # low 0.5, high 2, mask_high 1: rho = 1 is on the band's closed edge (kept, weight 1);
    # rho = 2 > 1 is dropped (mask 0, weight 0); rho = 0.25 is kept and clipped up to 0.5
    out = CORRECTIONS.build("clipped_is", low=0.5, high=2.0, mask_high=1.0)(
        engine_input([[1.0, 2.0, 0.25]])
    )
    assert_close(out.mask, torch.tensor([[1.0, 0.0, 1.0]]))
    assert_close(out.weights, torch.tensor([[1.0, 0.0, 0.5]]))
    assert out.metrics["is_masked_frac"] == pytest.approx(1 / 3)


def test_predictive_mask_disagreement_rate_ignores_padding():
    # pi = (0.1, 0.8, 0.1), mu = (0.11, 0.88, 0.01) at every position; KL(mu || pi) =
    # 0.99 log 1.1 + 0.01 log 0.1 = 0.0713 > delta = 0.05: every token is outside.
    # Direction (KL): s = (pi_y - mu_y) - sum_v pi_v (pi_v - mu_v), the sum being
    # 0.1 (-0.01) + 0.8 (-0.08) + 0.1 (0.09) = -0.056.
    #   y = 0: s = -0.01 + 0.056 > 0 (grows), but r = 0.1 / 0.11 < 1: PPO's test disagrees
    #   y = 2: s = 0.09 + 0.056 > 0 (grows), r = 0.1 / 0.01 > 1: agrees
    # A = 1: both valid tokens are masked; disagreement among outside valid tokens = 1/2
    # (token 2 is padding with y = 0: it must not count)
    pi = torch.tensor([0.1, 0.8, 0.1]).log().expand(1, 3, 3)
    mu = torch.tensor([0.11, 0.88, 0.01]).log().expand(1, 3, 3)
    y = torch.tensor([[0, 2, 0]])
    dists = TokenDistributions(pi.clone(), mu.clone(), y)
    logp = torch.tensor([[0.1, 0.1, 0.1]]).log()
    old = torch.tensor([[0.11, 0.01, 0.11]]).log()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    inp = RatioInput(logp, old, mask, advantages=torch.tensor([1.0]), dists=dists)
    out = CORRECTIONS.build(
        "predictive_divergence_mask", divergence="kl", threshold=0.05, estimator="renorm"
    )(inp)
    assert_close(out.mask, torch.zeros(1, 3))
    assert out.metrics["pdm_ratio_disagree_frac"] == pytest.approx(0.5)
    assert out.metrics["pdm_outside_frac"] == pytest.approx(1.0)


# ------------------------------------------------------------------ ratios


def test_cumulative_ratio_reports_the_largest_absolute_log_ratio():
    # token log-ratios 0.1, 0.2, -0.5 (+ a masked 9): log R = 0.1, 0.3, -0.2, 0 -> max |.| 0.3
    logp = torch.tensor([[0.1, 0.2, -0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = RATIOS.build("cumulative")(RatioInput(logp, torch.zeros_like(logp), mask))
    assert_close(out.log_ratio, torch.tensor([[0.1, 0.3, -0.2, 0.0]]))
    assert out.metrics["log_ratio_abs_max"] == pytest.approx(0.3)
