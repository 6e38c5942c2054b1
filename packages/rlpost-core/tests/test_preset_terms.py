"""The preset loss's non-policy-gradient terms against hand-worked values: the entropy
bonus, the KL in the loss (with ASTOR's per-row scale), the KL in the reward. Each value
and gradient below is written out from the formula, not from the library, so a flipped
sign or a dropped coefficient in ``Recipe.policy_loss`` fails here."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.core.kl import kl_reward_penalty
from rlpost.core.presets import PolicyBatch, get_preset

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOGP = [[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]]
REF = [[-1.5, -2.0, -0.3], [-1.0, -1.0, -2.0]]
ENTROPY = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


def _loss(preset, advantages: float, **kw):
    """The preset's loss at ratio 1 (old = current log-probs) with constant advantages."""
    logp = torch.tensor(LOGP, requires_grad=True)
    batch = PolicyBatch(logp, logp.detach().clone(), torch.full((2, 3), advantages), MASK, **kw)
    return preset.build().policy_loss(batch).loss, logp


def _seq_mean_token_mean(rows: list[list[float]]) -> float:
    """Each row's mean over its unmasked tokens, then the mean over rows."""
    lens = [3, 2]
    return sum(sum(r[:n]) / n for r, n in zip(rows, lens, strict=True)) / 2


def test_the_entropy_bonus_lowers_the_loss_by_coef_times_the_mean_entropy():
    preset = get_preset("grpo").replace(kl_coef=0.0, entropy_coef=0.1)
    assert preset.aggregation.name == "seq_mean_token_mean"
    ent = torch.tensor(ENTROPY, requires_grad=True)
    loss, _ = _loss(preset, 1.0, entropy=ent)
    # per token: -A * ratio - 0.1 * H = -1 - 0.1 H
    # row 1: mean(-1.1, -1.2, -1.3) = -1.2; row 2: mean(-1.4, -1.5) = -1.45
    assert loss.item() == pytest.approx((-1.2 - 1.45) / 2, abs=1e-6)  # -1.325
    (g,) = torch.autograd.grad(loss, ent)
    want = [[-0.1 / 3 / 2] * 3, [-0.1 / 2 / 2, -0.1 / 2 / 2, 0.0]]  # masked token: 0
    torch.testing.assert_close(g, torch.tensor(want))


def test_the_kl_in_the_loss_adds_beta_times_k3_and_its_gradient():
    beta = 0.5
    preset = get_preset("grpo").replace(kl_coef=beta)
    assert preset.kl.name == "k3" and not preset.kl_in_reward
    loss, logp = _loss(preset, 0.0, ref_logp=torch.tensor(REF))
    r = [[REF[i][t] - LOGP[i][t] for t in range(3)] for i in range(2)]
    k3 = [[math.exp(x) - x - 1 for x in row] for row in r]  # exp(ref - logp) - (ref - logp) - 1
    assert loss.item() == pytest.approx(beta * _seq_mean_token_mean(k3), abs=1e-6)
    (g,) = torch.autograd.grad(loss, logp)
    # d k3 / d logp = 1 - exp(ref - logp); the policy-gradient term is 0 at A = 0
    n = [3, 2]
    want = [
        [beta * (1 - math.exp(r[i][t])) / n[i] / 2 if MASK[i, t] else 0.0 for t in range(3)]
        for i in range(2)
    ]
    torch.testing.assert_close(g, torch.tensor(want))


def test_the_per_row_kl_scale_multiplies_each_rows_kl():
    preset = get_preset("grpo").replace(kl_coef=0.5)
    ref = torch.tensor(REF)
    base, _ = _loss(preset, 0.0, ref_logp=ref)
    scaled, _ = _loss(preset, 0.0, ref_logp=ref, kl_scale=torch.tensor([2.0, 0.0]))
    r0 = [REF[0][t] - LOGP[0][t] for t in range(3)]
    row0 = sum(math.exp(x) - x - 1 for x in r0) / 3
    assert scaled.item() == pytest.approx(0.5 * 2.0 * row0 / 2, abs=1e-6)
    assert base.item() != pytest.approx(scaled.item())


def test_the_kl_in_the_reward_is_minus_beta_times_the_estimate_per_token():
    old, ref = torch.tensor(LOGP), torch.tensor(REF)
    got = kl_reward_penalty(old, ref, MASK, 0.1, "k1")
    want = [
        [-0.1 * (LOGP[i][t] - REF[i][t]) * MASK[i, t].item() for t in range(3)] for i in range(2)
    ]
    torch.testing.assert_close(got, torch.tensor(want))
    k3 = kl_reward_penalty(old, ref, MASK, 0.1, "k3")
    want3 = [
        [-0.1 * (math.exp(REF[i][t] - LOGP[i][t]) - (REF[i][t] - LOGP[i][t]) - 1) * MASK[i, t].item()
         for t in range(3)]
        for i in range(2)
    ]  # fmt: skip
    torch.testing.assert_close(k3, torch.tensor(want3))
    assert not got.requires_grad  # a reward: no gradient flows through it


def test_a_preset_with_the_kl_in_the_reward_adds_no_kl_to_the_loss():
    preset = get_preset("grpo").replace(kl_coef=0.5, kl_in_reward=True)
    with_ref, _ = _loss(preset, 0.0, ref_logp=torch.tensor(REF))
    assert with_ref.item() == pytest.approx(0.0, abs=1e-7)  # A = 0, ratio 1, KL elsewhere


# ------------------------------------------------------------------ from the mutation pass


def test_a_zero_kl_coefficient_asks_the_trainer_for_no_reference():
    """A preset naming a KL estimator with ``kl_coef = 0`` must not make a trainer run
    the reference model (a whole extra forward per step)."""
    from rlpost.core.contract import Input

    assert Input.REF_LOGPROBS in get_preset("grpo").build().needs()  # beta 0.04
    assert Input.REF_LOGPROBS not in get_preset("grpo").replace(kl_coef=0.0).build().needs()


def _topk(student_logits, teacher_logits):
    from rlpost.core.distill import TeacherDistributions

    s = torch.log_softmax(torch.tensor(student_logits), -1).expand(2, 3, -1).clone()
    t = torch.log_softmax(torch.tensor(teacher_logits), -1).expand(2, 3, -1).clone()
    return TeacherDistributions(s, t, torch.zeros(2, 3, dtype=torch.long))


def test_tokens_outside_the_teacher_mask_are_not_distilled():
    """``teacher_mask`` 0 (a token the teacher does not score): what the teacher says
    there changes nothing, and the loss stays finite."""
    preset = get_preset("opd")
    tm = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])

    def loss(teacher):
        topk = _topk([0.0, 1.0], teacher)
        tl = topk.teacher[..., 0]
        out, _ = _loss(preset, 0.0, teacher_topk=topk, teacher_logp=tl, teacher_mask=tm)
        return out

    a, b = loss([2.0, -1.0]), loss([2.0, -1.0])
    assert torch.isfinite(a) and a.item() > 0
    # change the teacher only where the mask is 0: the same loss
    topk = _topk([0.0, 1.0], [2.0, -1.0])
    other = _topk([0.0, 1.0], [-5.0, 4.0]).teacher
    topk.teacher[tm == 0] = other[tm == 0]
    c, _ = _loss(preset, 0.0, teacher_topk=topk, teacher_logp=topk.teacher[..., 0], teacher_mask=tm)
    assert c.item() == pytest.approx(a.item(), rel=1e-6) and a.item() == b.item()


def test_atod_reports_the_heavier_turns_weight():
    """ATOD (004-27) with equal per-token KL in two turns whose mean entropies are 1 and
    3: s = (1, 3) k, mean 2k, ratios 0.5 and 1.5, weights 0.5 + 0.5 ratio = 0.75 and
    1.25 (alpha 0.5, below w_max 3); the metric reports the larger, 1.25."""
    from rlpost.core import TrainingDynamics

    preset = get_preset("atod")
    assert preset.distill_turns.alpha == 0.5 and preset.distill_turns.w_max == 3.0
    topk = _topk([0.0, 1.0], [2.0, -1.0])  # the same KL at every token
    turns = torch.tensor([[0, 0, 1], [0, 1, -1]])
    ent = torch.tensor([[1.0, 1.0, 3.0], [1.0, 3.0, 0.0]])
    logp = torch.tensor(LOGP, requires_grad=True)
    batch = PolicyBatch(
        logp, logp.detach().clone(), torch.zeros(2, 3), MASK, teacher_topk=topk,
        teacher_logp=topk.teacher[..., 0], entropy=ent, turn_ids=turns,
        dynamics=TrainingDynamics(progress=0.5),
    )  # fmt: skip
    metrics = preset.build().policy_loss(batch).metrics
    assert metrics["distill/turn_weight_max"] == pytest.approx(1.25, abs=1e-5)


def test_a_batch_coupled_loss_counts_only_real_responses():
    """ESS-adaptive reads a statistic of the whole step batch: a call whose fourth row is
    padding (mask all 0) holds 3 responses, not the 4 the step has, and is refused."""
    from rlpost.core.presets import Choice

    preset = get_preset("grpo").replace(objective=Choice("ess_adaptive"), kl_coef=0.0)
    logp = torch.zeros(4, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    batch = PolicyBatch(logp, logp.detach(), torch.ones(4, 3), mask, global_sequences=4.0)
    with pytest.raises(ValueError, match="holds 3 of its 4"):
        preset.build().policy_loss(batch)
    ok = PolicyBatch(logp, logp.detach(), torch.ones(4, 3), mask, global_sequences=3.0)
    assert torch.isfinite(preset.build().policy_loss(ok).loss)
