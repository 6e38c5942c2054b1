"""On-policy distillation estimators, schedules and row filters (rlpost.core.distill)."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlpost.core.advantages import TrainingDynamics
from rlpost.core.contract import ContractError
from rlpost.core.distill import (
    DISTILL_ESTIMATORS,
    DistillInput,
    DistillSchedule,
    TeacherDistributions,
    TurnReweight,
    distill_rows,
    turn_weights,
)
from rlpost.core.presets import PRESETS, Choice, PolicyBatch

B, T, V, K = 3, 4, 6, 2


def _logits(seed: int):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    t = s + 0.8 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    return s, t


def _input(s_logits, t_logits, tokens, mask=None, k: int | None = K) -> DistillInput:
    """Student log-probs (a function of ``s_logits``, so gradients reach the logits) and
    the teacher's, over the teacher's top-``k`` ids (``k=None``: the vocabulary)."""
    s_all = s_logits.log_softmax(-1)
    t_all = t_logits.log_softmax(-1)
    ids = torch.arange(V).expand(B, T, V) if k is None else t_all.topk(k, -1).indices
    hit = ids == tokens[..., None]
    col = torch.where(hit.any(-1), hit.long().argmax(-1), torch.full_like(tokens, -1))
    dists = TeacherDistributions(s_all.gather(-1, ids), t_all.gather(-1, ids), col)
    logp = s_all.gather(-1, tokens[..., None])[..., 0]
    t_logp = t_all.gather(-1, tokens[..., None])[..., 0]
    mask = torch.ones_like(logp.detach()) if mask is None else mask
    return DistillInput(logp, mask, t_logp, topk=dists if k else None, full=dists)


def _reverse_kl(s_logits, t_logits):
    """KL(pi_s || pi_t) per position, through torch.distributions (independent of ours)."""
    ps = torch.distributions.Categorical(logits=s_logits)
    pt = torch.distributions.Categorical(logits=t_logits)
    return torch.distributions.kl_divergence(ps, pt)


def test_full_equals_the_exact_reverse_kl_and_its_gradient():
    s, t = _logits(0)
    s = s.requires_grad_(True)
    tokens = torch.zeros(B, T, dtype=torch.long)
    out = DISTILL_ESTIMATORS("full", _input(s, t, tokens, k=None))
    ref = _reverse_kl(s, t)
    torch.testing.assert_close(out.kl, ref.detach())
    (g,) = torch.autograd.grad(out.loss.sum(), s)
    (g_ref,) = torch.autograd.grad(ref.sum(), s)
    torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("name", ["sampled", "topk"])
def test_estimators_are_unbiased_for_the_value_and_the_gradient(name):
    """E_{y ~ pi_s}[estimate] and E[gradient] equal the full-vocabulary KL and its
    gradient, computed exactly by enumerating every token y at every position."""
    s, t = _logits(1)
    s = s.requires_grad_(True)
    probs = s.detach().softmax(-1)
    value = torch.zeros(B, T, dtype=torch.float64)
    grad = torch.zeros_like(s)
    for v in range(V):
        tokens = torch.full((B, T), v, dtype=torch.long)
        out = DISTILL_ESTIMATORS(name, _input(s, t, tokens))
        w = probs[..., v]
        value += w * out.kl
        (g,) = torch.autograd.grad((out.loss * w).sum(), s)
        grad += g
    ref = _reverse_kl(s, t)
    (g_ref,) = torch.autograd.grad(ref.sum(), s)
    torch.testing.assert_close(value, ref.detach())
    torch.testing.assert_close(grad, g_ref)


def test_topk_over_the_whole_vocabulary_is_full():
    s, t = _logits(2)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    inp = _input(s, t, tokens, k=V)
    a, b = DISTILL_ESTIMATORS("topk", inp), DISTILL_ESTIMATORS("full", inp)
    torch.testing.assert_close(a.loss, b.loss)


@pytest.mark.parametrize("name", ["sampled", "topk", "full"])
def test_student_equal_to_teacher_gives_zero_loss_and_gradient(name):
    s, _ = _logits(3)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    out = DISTILL_ESTIMATORS(name, _input(s, s.detach(), tokens, k=None if name == "full" else K))
    (g,) = torch.autograd.grad(out.loss.sum(), s)
    assert (out.loss == 0).all() and (g == 0).all()


@pytest.mark.parametrize("name", ["sampled", "topk", "full"])
def test_masked_positions_and_padding_give_zero_and_no_nan(name):
    s, t = _logits(4)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, 2:] = 0
    inp = _input(s, t, tokens, mask, k=None if name == "full" else K)
    pad = mask == 0  # padding carries -inf log-probs in a real batch
    inp = DistillInput(
        inp.logp.masked_fill(pad, -torch.inf),
        mask,
        inp.teacher_logp.masked_fill(pad, -torch.inf),
        topk=inp.topk,
        full=inp.full,
    )
    out = DISTILL_ESTIMATORS(name, inp)
    (g,) = torch.autograd.grad(out.loss.sum(), s)
    assert torch.isfinite(out.loss).all() and torch.isfinite(g).all()
    assert (out.loss[pad] == 0).all() and (g[0, 2:] == 0).all()
    assert (g[1] != 0).any()


def test_full_refuses_a_top_k_set():
    s, t = _logits(5)
    inp = _input(s, t, torch.zeros(B, T, dtype=torch.long), k=K)
    with pytest.raises(ValueError, match="do not cover the vocabulary"):
        DISTILL_ESTIMATORS("full", DistillInput(inp.logp, inp.mask, full=inp.topk))


def test_an_estimator_without_its_teacher_input_is_refused():
    s, t = _logits(6)
    inp = _input(s, t, torch.zeros(B, T, dtype=torch.long))
    with pytest.raises(ContractError, match="teacher_logprobs"):
        DISTILL_ESTIMATORS("sampled", DistillInput(inp.logp, inp.mask))


def test_atod_schedule_hits_its_endpoints_and_is_monotone():
    sch = DistillSchedule.atod()
    assert sch.weights(0.0) == (1.0, 0.0)
    assert sch.weights(1.0) == (0.0, 1.0)
    ws = [sch.weights(p / 20) for p in range(21)]
    assert all(a[0] >= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(ws))
    half = DistillSchedule.atod(horizon=0.5, shape="linear")
    assert half.weights(0.25) == (0.5, 0.5) and half.weights(0.5) == half.weights(0.9) == (0, 1)
    assert DistillSchedule().weights(0.7) == (1.0, 1.0)
    with pytest.raises(ValueError, match="horizon"):
        DistillSchedule.atod(horizon=0.0)


def test_row_filters_pick_correct_or_incorrect_responses():
    correct = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert distill_rows(correct, "all").tolist() == [1, 1, 1, 1]
    assert distill_rows(correct, "correct").tolist() == [1, 0, 1, 0]
    assert distill_rows(correct, "incorrect").tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="one of all, correct, incorrect"):
        distill_rows(correct, "wrong")


def _batch(s, t, tokens, adv, dyn=None, sl=slice(None)):
    inp = _input(s[sl], t[sl], tokens[sl])
    return PolicyBatch(
        inp.logp,
        inp.logp.detach(),
        adv[sl],
        inp.mask,
        teacher_logp=inp.teacher_logp,
        teacher_topk=inp.topk,
        entropy=torch.ones_like(inp.logp.detach()),
        dynamics=dyn,
        global_tokens=float(B * T),
        global_sequences=float(B),
    )


def test_pure_opd_gradient_is_the_distillation_gradient_alone():
    """opd weighs the RL term 0: whatever the advantages, the gradient is the reverse
    KL's (token_mean over the batch), and zero when the student is the teacher."""
    s, t = _logits(7)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    recipe = PRESETS["opd"].build()
    grads = []
    for adv in (torch.zeros(B), torch.tensor([3.0, -1.0, 2.0])):
        out = recipe.policy_loss(_batch(s, t, tokens, adv))
        grads.append(torch.autograd.grad(out.loss, s)[0])
    torch.testing.assert_close(grads[0], grads[1])
    d = DISTILL_ESTIMATORS("topk", _input(s, t, tokens))
    (g_d,) = torch.autograd.grad(d.loss.sum() / (B * T), s)
    torch.testing.assert_close(grads[0], g_d)
    out = recipe.policy_loss(_batch(s, s.detach(), tokens, torch.ones(B)))
    assert torch.autograd.grad(out.loss, s)[0].abs().max() == 0


def test_opd_rl_micro_batches_sum_to_the_full_batch():
    s, t = _logits(8)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    adv = torch.tensor([1.0, -0.5, 0.25])
    recipe = PRESETS["opd_rl"].build()
    (full,) = torch.autograd.grad(recipe.policy_loss(_batch(s, t, tokens, adv)).loss, s)
    parts = sum(
        torch.autograd.grad(recipe.policy_loss(_batch(s, t, tokens, adv, sl=sl)).loss, s)[0]
        for sl in (slice(0, 1), slice(1, 3))
    )
    torch.testing.assert_close(parts, full)


def test_atod_moves_the_gradient_from_distillation_to_rl():
    s, t = _logits(9)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    adv = torch.tensor([1.0, -0.5, 0.25])
    recipe = PRESETS["atod"].build()
    rl = PRESETS["opd_rl"].replace(distill=None).build()

    def grad(r, progress, teacher=t):
        dyn = TrainingDynamics(progress, 1.0, 1.0)
        return torch.autograd.grad(r.policy_loss(_batch(s, teacher, tokens, adv, dyn)).loss, s)[0]

    opd_only = grad(recipe, 0.0, t) - grad(recipe, 0.0, s.detach())  # the RL part is 0
    torch.testing.assert_close(grad(recipe, 0.0, s.detach()), torch.zeros_like(s))
    assert opd_only.abs().max() > 0
    torch.testing.assert_close(grad(recipe, 1.0), grad(rl, 1.0))
    with pytest.raises(ContractError, match="dynamics"):
        recipe.policy_loss(_batch(s, t, tokens, adv, None))


def test_tdur_amplifies_the_turn_of_high_disagreement_and_uncertainty():
    # one trajectory, three turns of two tokens each, the last token unused
    kl = torch.tensor([[0.1, 0.1, 1.0, 1.0, 0.1, 0.1, 9.0]])
    ent = torch.tensor([[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 9.0]])
    turns = torch.tensor([[0, 0, 1, 1, 2, 2, -1]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 1, 1]])
    p = TurnReweight(alpha=1.0, w_max=10.0)
    w = turn_weights(kl, ent, mask, turns, p)
    s = torch.tensor([0.1, 2.0, 0.1])  # D * U per turn
    want = s / s.mean()
    torch.testing.assert_close(w[0, :6], want.repeat_interleave(2))
    assert w[0, 6] == 0  # not a policy token
    assert w[0, :6].sum() / 6 == pytest.approx(1.0)  # redistributed, not scaled
    half = turn_weights(kl, ent, mask, turns, TurnReweight(alpha=0.5, w_max=10.0))
    torch.testing.assert_close(half[0, :6], 0.5 + 0.5 * want.repeat_interleave(2))
    clipped = turn_weights(kl, ent, mask, turns, TurnReweight(alpha=1.0, w_max=1.5))
    assert clipped.max() == 1.5
    uniform = turn_weights(kl, ent, mask, turns, TurnReweight(alpha=0.0))
    assert (uniform[0, :6] == 1).all()


def test_tdur_without_turns_or_signal_keeps_weight_one():
    kl, ent = torch.rand(2, 4), torch.rand(2, 4)
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(turn_weights(kl, ent, mask, None, TurnReweight()), mask)
    zero = turn_weights(torch.zeros(2, 4), ent, mask, torch.zeros(2, 4, dtype=torch.long),
                        TurnReweight(alpha=1.0))  # fmt: skip
    assert torch.equal(zero, mask)
    with pytest.raises(ValueError, match="alpha"):
        TurnReweight(alpha=2.0)


def test_atod_declares_entropy_and_reads_turns():
    r = PRESETS["atod"].build()
    assert "entropy" in r.needs() and "turns" in r.reads() and "turns" not in r.needs()


def test_sampled_on_text_blocks_is_reinforce_on_each_block():
    """A teacher with another tokenizer scores text blocks: block gap d_k = sum of the
    student's log-probs in the block - the teacher's block log-prob; every token of the
    block gets the gradient coefficient d_k, the block's value is d_k once."""
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.1]], requires_grad=True)
    teacher = torch.tensor([[0.0, -3.0, -1.5, 0.0]])  # block sums: -3.0 and -1.5
    spans = torch.tensor([[0, 0, 1, 1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding
    out = DISTILL_ESTIMATORS("sampled", DistillInput(logp, mask, teacher, spans=spans))
    d0, d1 = (-0.5 - 1.0) - (-3.0), -2.0 - (-1.5)
    torch.testing.assert_close(out.kl, torch.tensor([[d0 / 2, d0 / 2, d1, 0.0]]))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    torch.testing.assert_close(g, torch.tensor([[d0, d0, d1, 0.0]]))
    # one token per block is the token-level estimator
    s, t = _logits(10)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(6))
    inp = _input(s, t, tokens)
    ident = torch.arange(T).expand(B, T)
    a = DISTILL_ESTIMATORS("sampled", inp)
    b = DISTILL_ESTIMATORS(
        "sampled", DistillInput(inp.logp, inp.mask, inp.teacher_logp, spans=ident)
    )
    torch.testing.assert_close(a.loss, b.loss)


def test_full_checks_the_vocabulary_mass_only_where_it_distills():
    """Padding (mask 0) may hold anything, e.g. an all-zero log-prob row (mass V): the
    check that the student covers the vocabulary reads the distilled positions only."""
    s, t = _logits(6)
    inp = _input(s, t, torch.zeros(B, T, dtype=torch.long), k=None)
    student = inp.full.student.detach().clone()
    student[:, -1] = 0.0  # the padded last position: mass V, not 1
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[:, -1] = 0
    full = TeacherDistributions(student, inp.full.teacher, inp.full.sampled_index)
    out = DISTILL_ESTIMATORS("full", DistillInput(inp.logp, mask, full=full))
    assert torch.isfinite(out.loss).all() and (out.loss[:, -1] == 0).all()
    with pytest.raises(ValueError, match="do not cover the vocabulary"):  # distilled: refused
        DISTILL_ESTIMATORS("full", DistillInput(inp.logp, torch.ones_like(mask), full=full))


@pytest.mark.parametrize("weight", [1.0, 3.0])
def test_sdpo_is_grpos_gradient_plus_the_self_distillation_at_its_weight(weight):
    """SDPO (004-20): the verifier's GRPO term plus dense self-distillation, weight 1
    each by default; a denser schedule scales the distillation's gradient and nothing
    else. Against GRPO's preset (without its KL, token-mean aggregation) and the
    estimator called on its own."""
    s, t = _logits(11)
    s = s.requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(6))
    adv = torch.tensor([1.0, -0.5, 0.25])
    grpo = PRESETS["grpo"].replace(kl=None, kl_coef=0.0, aggregation=Choice("token_mean"))
    (g_rl,) = torch.autograd.grad(grpo.build().policy_loss(_batch(s, t, tokens, adv)).loss, s)
    d = DISTILL_ESTIMATORS("topk", _input(s, t, tokens))
    (g_d,) = torch.autograd.grad(d.loss.sum() / (B * T), s)
    sched = DistillSchedule(distill_start=weight, distill_end=weight)
    recipe = PRESETS["sdpo"].replace(distill_schedule=sched).build()
    (g,) = torch.autograd.grad(recipe.policy_loss(_batch(s, t, tokens, adv)).loss, s)
    torch.testing.assert_close(g, g_rl + weight * g_d)
    assert g_d.abs().max() > 1e-3 and g_rl.abs().max() > 1e-3  # (both terms present)
