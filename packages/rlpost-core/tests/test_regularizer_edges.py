"""Edge cases of the gradient regularisers (GAC, CPO, Dr. Post-Training) and the token
weightings (anchors, explorers, random_subset, dynamic) that the rest of the suite left
open: exact cuts, accumulation over several tasks, mixing and metrics against hand-worked
values, and the documented parameter ranges at their boundaries.

Written from a mutation-testing pass (``tools/mutate_core.py --registry regularizer`` and
``--registry token_weighting``): each test kills mutants that survived the older tests.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import REGULARIZERS, TOKEN_WEIGHTINGS, GradientInput, TrainingDynamics
from rlpost.core.regularizers import (
    CPORegularizer,
    GACController,
    dr_project,
    gac_signals,
    movement_fisher,
)
from rlpost.core.weights import TokenWeightInput

f64 = torch.float64


# ------------------------------------------------------------------------------ CPO


def test_fisher_cut_separates_adjacent_floats():
    # delta = [3, 3 - 2^-22] (the float32 just below 3): delta^2 = [9, 9 - 1.5 * 2^-20 + 2^-44],
    # which float32 rounds to [9, 9 - 2^-20], the two adjacent floats at 9. density 0.5 keeps
    # the top ceil(0.5 * 2) = 1 entry, so the cut must fall exactly between them.
    three = torch.tensor([3.0])
    below = torch.nextafter(three, torch.zeros(1))
    nine_below = torch.nextafter(torch.tensor([9.0]), torch.zeros(1))
    assert torch.equal(below.square(), nine_below)  # the precondition of the hand calculation
    F = movement_fisher([torch.zeros(2)], [torch.cat([three, below])], density=0.5)[0]
    mean = (9.0 + nine_below.item()) / 2
    assert_close(F, torch.tensor([9.0 / mean, 0.0]))
    assert F[1] == 0  # the runner-up, one float below the cut, is not kept


def test_cpo_regularizer_rejects_density_above_one():
    w = torch.nn.Parameter(torch.zeros(2))
    CPORegularizer([w], density=1.0)  # the upper end of (0, 1] is allowed
    with pytest.raises(ValueError, match="density"):
        CPORegularizer([w], density=1.5)


# Two tasks, density 1 (every entry kept):
#   task 1: theta [0, 0] -> [1, 2]: delta^2 = [1, 4], mean 2.5 -> F1 = [0.4, 1.6]
#   task 2: theta [1, 2] -> [3, 2]: delta^2 = [4, 0], mean 2   -> F2 = [2.0, 0.0]
#   F = F1 + F2 = [2.4, 1.6], anchor = [3, 2]
# At theta = [4, 1]: theta - anchor = [1, -1], grad R = F (theta - anchor) = [2.4, -1.6],
# R = (1/2) (2.4 * 1 + 1.6 * 1) = 2.0
THETAS = ([0.0, 0.0], [1.0, 2.0], [3.0, 2.0])
FISHER_SUM = [2.4, 1.6]
ANCHOR = [3.0, 2.0]


def test_cpo_regularizer_sums_the_fisher_of_successive_tasks():
    w = torch.nn.Parameter(torch.tensor(THETAS[0]))
    reg = CPORegularizer([w], coef=1.0, density=1.0)
    for end in THETAS[1:]:
        reg.begin_task()
        with torch.no_grad():
            w.copy_(torch.tensor(end))
        reg.end_task()
    assert_close(reg.fisher[0], torch.tensor(FISHER_SUM))
    assert_close(reg.anchor[0], torch.tensor(ANCHOR))
    with torch.no_grad():
        w.copy_(torch.tensor([4.0, 1.0]))
    penalty = reg.penalty()
    (g,) = torch.autograd.grad(penalty, w)
    assert_close(penalty, torch.tensor(2.0))
    assert_close(g, torch.tensor([2.4, -1.6]))


def test_cpo_entry_sums_task_fishers_and_pulls_towards_a_nonzero_anchor():
    cpo = REGULARIZERS.build("cpo", coef=1.0, density=1.0)
    grad = torch.tensor([1.0, 1.0])
    state: dict = {}
    steps = [("begin", THETAS[0]), ("end", THETAS[1]), ("begin", THETAS[1]), ("end", THETAS[2])]
    for boundary, theta in steps:
        theta = torch.tensor(theta)
        out = cpo(GradientInput(grad, parameters=theta, task_boundary=boundary, state=state))
        state = out.state
        # at a boundary the parameters sit at the anchor (or no task has ended): no pull
        assert torch.equal(out.grad, grad)
    assert_close(state["fisher"], torch.tensor(FISHER_SUM))
    assert_close(state["anchor"], torch.tensor(ANCHOR))
    out = cpo(GradientInput(grad, parameters=torch.tensor([4.0, 1.0]), state=state))
    # g = grad + coef F (theta - anchor) = [1, 1] + [2.4, -1.6]
    assert_close(out.grad, torch.tensor([3.4, -0.6]))
    assert out.metrics["cpo/penalty"] == pytest.approx(2.0)


# ------------------------------------------------------------------------------ Dr.


def test_dr_metrics_are_the_relative_change_and_the_strict_conflict_count():
    # g = (2, -2); general rows h1 = (0, 1), h2 = (1, 0), h3 = (1, 1): H g = (-2, 2, 0), so
    # only h1 conflicts (h3 is orthogonal: no first-order rise, not a conflict). Removing the
    # h1 component gives d = (2, 0), which agrees with all three rows.
    # ||d - g|| / ||g|| = 2 / (2 sqrt 2) = 1 / sqrt 2.
    g = torch.tensor([2.0, -2.0])
    H = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    out = REGULARIZERS("dr_post_training", GradientInput(g, aux_grads=H), feasible="agree")
    assert_close(out.grad, torch.tensor([2.0, 0.0]))
    assert out.metrics["dr/changed"] == pytest.approx(1 / math.sqrt(2))
    assert out.metrics["dr/conflicts"] == 1.0


def test_dr_zero_gradient_reports_no_change():
    # ||g|| = 0: the relative change is reported as 0, not a division by zero
    g = torch.zeros(2)
    out = REGULARIZERS("dr_post_training", GradientInput(g, aux_grads=torch.tensor([[1.0, 0.0]])))
    assert torch.equal(out.grad, g)
    assert out.metrics["dr/changed"] == 0.0
    assert out.metrics["dr/conflicts"] == 0.0


def test_agree_ignores_general_rows_at_or_below_the_relative_zero_threshold():
    # Rows with ||h_j||^2 <= 1e-12 * max_i ||h_i||^2 count as zero rows (w_j = 0).
    # g = (0, -1), h1 = (1, 0), h2 = (0, 1e-6): ||h2||^2 = 1e-12 (exactly, in float64) =
    # 1e-12 * ||h1||^2, so h2 is ignored and, as g agrees with h1 (<g, h1> = 0), d = g.
    g = torch.tensor([0.0, -1.0], dtype=f64)
    at = torch.tensor([[1.0, 0.0], [0.0, 1e-6]], dtype=f64)
    assert at[1] @ at[1] == 1e-12 * (at[0] @ at[0])  # exactly at the threshold
    assert torch.equal(dr_project(g, at, "agree"), g)
    # just above it (||h2||^2 = 4e-12) the conflict is removed: d = g - (<g,h>/||h||^2) h = 0
    above = torch.tensor([[1.0, 0.0], [0.0, 2e-6]], dtype=f64)
    assert_close(dr_project(g, above, "agree"), torch.zeros(2, dtype=f64), rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------ GAC


def test_gac_signals_accept_two_samples():
    # K = 2, the documented minimum.
    # sft rows (1, 0), (3, 0): mean (2, 0), sum ||g_k - gbar||^2 = 1 + 1 = 2, v = 2 / (2 * 1) = 1
    # rl rows (0, 0), (0, 2):  mean (0, 1), sum ||g_k - gbar||^2 = 1 + 1 = 2, v = 1
    # d = ||(2, 0) - (0, 1)||^2 - 1 - 1 = 5 - 2 = 3
    s = gac_signals(torch.tensor([[1.0, 0.0], [3.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 2.0]]))
    assert (s.sft_var, s.rl_var, s.disagreement) == pytest.approx((1.0, 1.0, 3.0))


@pytest.mark.parametrize(
    "setting",
    [
        {"max_step": 0.0},  # lam could never move
        {"eps": 0.0},  # all-zero signals would give lam* = 0 / 0
        {"smoothing": 1.0},  # the EMA would never move past the first signals
        {"prior": 1.5},  # the prior is a weight in [0, 1]
        {"prior_weight": 1.5},
    ],
    ids=lambda s: next(iter(s)),
)
def test_controller_rejects_settings_at_or_past_the_open_ends_of_their_ranges(setting):
    GACController(max_step=1e-3, eps=1e-30, smoothing=0.99, prior=1.0, prior_weight=1.0)
    with pytest.raises(ValueError):
        GACController(**setting)


# prior_weight 1 makes the target the prior (0.25) whatever the signals, and max_step 1
# lets the first update reach it: lam = 0.25 after this step.
FIXED_LAM = {"init": 0.5, "prior": 0.25, "prior_weight": 1.0, "max_step": 1.0}


def test_gac_update_is_the_lambda_mix_of_the_aux_mean_and_the_gradient():
    # g = lam mean(aux) + (1 - lam) grad = 0.25 (2, 2) + 0.75 (4, -8) = (3.5, -5.5)
    grad = torch.tensor([4.0, -8.0])
    samples = torch.tensor([[5.0, -7.0], [3.0, -9.0]])  # mean = grad
    aux = torch.tensor([[4.0, 0.0], [0.0, 4.0]])  # mean (2, 2)
    out = REGULARIZERS("gac", GradientInput(grad, aux_grads=aux, grad_samples=samples), **FIXED_LAM)
    assert out.metrics["gac/lambda"] == pytest.approx(0.25)
    assert_close(out.grad, torch.tensor([3.5, -5.5]))


def test_gac_signals_use_the_common_rows_when_aux_and_samples_differ_in_count():
    # 3 aux rows, 2 samples: the signals use the first min(3, 2) = 2 rows of each (the K = 2
    # example of test_gac_signals_accept_two_samples: v_sft = 1, v_rl = 1, d = 3) while the
    # mix uses the mean of all 3 aux rows, (2, 1):
    # g = 0.25 (2, 1) + 0.75 (0, 1) = (0.5, 1.0)
    aux = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 3.0]])
    samples = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    grad = samples.mean(0)
    out = REGULARIZERS("gac", GradientInput(grad, aux_grads=aux, grad_samples=samples), **FIXED_LAM)
    m = out.metrics
    assert (m["gac/sft_var"], m["gac/rl_var"], m["gac/disagreement"]) == pytest.approx((1, 1, 3))
    assert_close(out.grad, torch.tensor([0.5, 1.0]))


# ------------------------------------------------------------------------ token weights

ENTROPY = torch.tensor([[0.1, 0.9, 5.0]])
TWO_VALID = torch.tensor([[1.0, 1.0, 0.0]])  # the 5.0 token is padding


@pytest.mark.parametrize(
    "which, kept", [("anchors", [1.0, 0.0, 0.0]), ("explorers", [0.0, 1.0, 0.0])]
)
def test_subset_fraction_is_kept_over_valid_tokens(which, kept):
    # n = 2 valid tokens, quantile 0.5: k = round(0.5 * 2) = 1 anchor (the lowest entropy,
    # 0.1) and min(1, 2 - 1) = 1 explorer (0.9; the padded 5.0 does not count): 1 / 2 kept
    out = TOKEN_WEIGHTINGS(which, TokenWeightInput(ENTROPY, TWO_VALID), quantile=0.5)
    assert torch.equal(out.weights, torch.tensor([kept]))
    assert out.metrics[f"{which}_frac"] == pytest.approx(0.5)
    # no valid token: nothing kept, fraction 0 (not 0 / 0)
    empty = TOKEN_WEIGHTINGS(which, TokenWeightInput(ENTROPY, torch.zeros(1, 3)), quantile=0.5)
    assert empty.metrics[f"{which}_frac"] == 0.0


def test_random_subset_fraction_is_kept_over_valid_tokens():
    # frac 1 keeps every valid token (u < 1 always), weight 1 / 1: 2 kept of 2 valid -> 1.0
    out = TOKEN_WEIGHTINGS("random_subset", TokenWeightInput(ENTROPY, TWO_VALID), frac=1.0)
    assert torch.equal(out.weights, TWO_VALID)
    assert out.metrics["random_subset_frac"] == pytest.approx(1.0)
    empty = TOKEN_WEIGHTINGS(
        "random_subset", TokenWeightInput(ENTROPY, torch.zeros(1, 3)), frac=1.0
    )
    assert empty.metrics["random_subset_frac"] == 0.0


def test_dynamic_reports_the_largest_valid_weight():
    # lam = 2 throughout; the two valid entropies (0, 2) whiten to z = -1, +1 (either std
    # convention gives |z| >= 1 / sqrt 2), clipped to -0.5, +0.5, so lam z = -1, +1 and
    # w = 2 exp(lam z) / (e^-1 + e) = (1 - tanh 1, 1 + tanh 1); the padded token gets 0.
    inp = TokenWeightInput(
        torch.tensor([[0.0, 2.0, 100.0]]), TWO_VALID, dynamics=TrainingDynamics(progress=0.5)
    )
    out = TOKEN_WEIGHTINGS("dynamic", inp, lam_start=2.0, lam_end=2.0, z_clip=0.5)
    t = math.tanh(1.0)
    assert_close(out.weights, torch.tensor([[1 - t, 1 + t, 0.0]]))
    assert out.metrics["token_weight_max"] == pytest.approx(1 + t)
    assert out.metrics["token_weight_mean"] == pytest.approx(1.0)
