"""ConSPO (catalog 000-25): group-wise InfoNCE on length-normalised sequence log-probs."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput, PolicyBatch, TrainingDynamics, get_preset
from rlpost.core.objectives.group import conspo_margin

torch.set_num_threads(1)


def seq_loss(out, mask):
    """seq_mean_token_mean numerator: sum_i (sum_t loss_it / |y_i|)."""
    return (out.loss.sum(1) / mask.sum(1)).sum()


def reference_grad_scores(s, adv, groups, tau, margin):
    """dL/ds by the closed form, with plain loops (independent of the implementation)."""
    g = torch.zeros(len(s), dtype=torch.float64)
    for i in range(len(s)):
        if adv[i] <= 0:
            continue
        negs = [j for j in range(len(s)) if groups[j] == groups[i] and adv[j] < 0]
        if not negs:
            continue
        zi = (s[i] - margin) / tau
        d = math.exp(zi) + sum(math.exp(s[j] / tau) for j in negs)
        g[i] += -(1 - math.exp(zi) / d)  # tau * (-1/tau) (1 - P_i)
        for j in negs:
            g[j] += math.exp(s[j] / tau) / d
    return g


def test_gradient_matches_closed_form():
    B, T = 7, 5
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 3, 4, 1, 5, 2, 4])
    mask = (torch.arange(T) < lengths[:, None]).float()
    logp = (-torch.rand(B, T, generator=gen)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.5, -0.5, -0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])  # group 2: a lone negative (no contrast)
    tau, margin = 0.2, 0.05
    out = OBJECTIVES.build("conspo", tau=tau, margin=margin)(
        ObjectiveInput(logp, logp.detach(), adv, mask, group_ids=groups)
    )
    (g,) = torch.autograd.grad(seq_loss(out, mask), logp)
    s = ((logp.detach() * mask).sum(1) / lengths).double()
    gs = reference_grad_scores(s.tolist(), adv.tolist(), groups.tolist(), tau, margin)
    assert_close(g, (gs[:, None] * mask / lengths[:, None]).float())
    assert (g[6] == 0).all() and (out.loss[6] == 0).all()
    # value: tau * (log D - z) summed over the positives 0, 2, 4
    z = (s - margin) / tau
    val = 0.0
    for i, negs in ((0, [1, 3]), (2, [1, 3]), (4, [5])):
        d = math.exp(z[i]) + sum(math.exp(s[j] / tau) for j in negs)
        val += tau * (math.log(d) - z[i].item())
    assert seq_loss(out, mask).item() == pytest.approx(val, rel=1e-5)


def test_gradient_larger_for_poorly_separated_positives_and_strong_negatives():
    # one group, one token per response: scores are the log-probs themselves
    s = torch.tensor([[-0.2], [-0.9], [-1.0], [-0.4]], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])  # positives: well (0) / poorly (1) separated
    inp = ObjectiveInput(s, s.detach(), adv, torch.ones(4, 1), group_ids=torch.zeros(4).long())
    out = OBJECTIVES.build("conspo", tau=0.1)(inp)
    (g,) = torch.autograd.grad(out.loss.sum(), s)
    g = g.flatten()
    # 1 - P_i with P_i = e^{s_i/tau} / (e^{s_i/tau} + e^{-10} + e^{-4}):
    # positive 0: 1 - 1/(1 + e^-8 + e^-2) = 0.11946; positive 1: 1 - 1/(1 + e^-1 + e^5) = 0.99332
    assert g[0].item() == pytest.approx(-0.11946, abs=1e-4)
    assert g[1].item() == pytest.approx(-0.99332, abs=1e-4)
    assert g[1].abs() > 8 * g[0].abs()  # poorly separated positive pushed 8.3x harder
    assert g[3] > g[2] > 0  # the high-scoring negative (-0.4) is pushed down harder
    # a margin keeps the pressure on the separated positive
    out_m = OBJECTIVES.build("conspo", tau=0.1, margin=0.1)(inp)
    (gm,) = torch.autograd.grad(out_m.loss.sum(), s)
    # with margin 0.1: 1 - 1/(1 + e^-7 + e^-1) = 0.26943 against 0.11946 without
    assert gm[0].item() == pytest.approx(-0.26943, abs=1e-4)


def test_groups_without_contrast_give_zero_and_group_ids_are_required():
    s = torch.tensor([[-0.2], [-0.9], [-1.0], [-0.4]], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    inp = ObjectiveInput(s, s.detach(), adv, torch.ones(4, 1), group_ids=torch.tensor([0, 0, 1, 1]))
    out = OBJECTIVES.build("conspo")(inp)  # all-positive and all-negative groups
    assert (out.loss == 0).all() and out.metrics["contrast_frac"] == 0.0
    # extreme score spreads (up to 30 nats per token, tau 0.1) stay finite: positive -0.1
    # vs negative -0.2 is 1 - 1/(1 + e^-1) = 0.26894; the -30 positives get -1, and the
    # -0.2 negative collects 0.26894 + 1 from the two positives of its group
    x = torch.tensor([[-0.1], [-30.0], [-0.2], [-15.0], [-0.1], [-30.0]], requires_grad=True)
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 1.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1])
    out = OBJECTIVES.build("conspo")(
        ObjectiveInput(x, x.detach(), a, torch.ones(6, 1), group_ids=ids)
    )
    (g,) = torch.autograd.grad(out.loss.sum(), x)
    assert torch.isfinite(out.loss).all() and torch.isfinite(g).all()
    assert g.flatten().tolist() == pytest.approx(
        [-0.26894, -1.0, 1.26894, 0.0, 1.0, -1.0], abs=1e-5
    )
    with pytest.raises(ValueError, match=r"'conspo' needs group_ids \(ObjectiveInput\.group_ids\)"):
        OBJECTIVES.build("conspo")(ObjectiveInput(s, s.detach(), adv, torch.ones(4, 1)))


def test_curriculum_margin_and_whole_groups_per_microbatch():
    assert conspo_margin(0.0) == 0.0 and conspo_margin(0.5) == pytest.approx(0.05)
    assert conspo_margin(1.0, 0.02, 0.2) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="progress"):
        conspo_margin(1.5)
    recipe = get_preset("conspo").replace(group_size=4).build()
    logp = -torch.rand(6, 3)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    with pytest.raises(ValueError, match=r"group\(s\) \[1\] have \[2\].*whole groups"):
        recipe.policy_loss(
            PolicyBatch(
                logp,
                logp,
                adv,
                torch.ones(6, 3),
                group_ids=torch.arange(6) // 4,
                dynamics=TrainingDynamics(0.5),
            )
        )
