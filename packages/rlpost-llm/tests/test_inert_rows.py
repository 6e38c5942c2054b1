"""Rows that add nothing to the gradient (an empty loss mask, or all-zero advantages under
an objective linear in them) are left out of the training forward and backward, and the
update is the full batch's (rlpost.llm.train.inert)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlpost.llm.train.inert import inert_rows, why_not
from rlpost.llm.trainer import Trainer


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def _counting(tr: Trainer) -> list[int]:
    """The rows of every training forward ``tr`` runs from now on."""
    seen, train = [], tr.forwards.train

    def counted(sub, **kw):
        seen.append(len(sub))
        return train(sub, **kw)

    tr.forwards.train = counted
    return seen


def _pair(fast_cfg, *overrides, reward=parity_reward):
    """Two trainers on the same weights: rows skipped (a) and every row trained (b); no
    gradient clipping (a clipped gradient would hide a wrong scale)."""
    torch.manual_seed(0)
    overrides = ("optim.grad_clip=null", *overrides)
    a = Trainer(fast_cfg(*overrides), reward_fn=reward)
    b = Trainer(fast_cfg(*overrides, "optim.skip_inert_rows=false"), reward_fn=reward)
    b.model.load_state_dict(a.model.state_dict())
    return a, b


def _degenerate_groups(col) -> int:
    r = col.rewards.view(-1, 4)
    return int((r.max(1).values == r.min(1).values).sum())


@pytest.mark.parametrize(
    "overrides",
    [
        ("algo.preset=grpo",),  # ppo_clip: rows of a degenerate group skipped one by one
        ("algo.preset=conspo",),  # group-coupled: whole groups only
        ("algo.preset=grpo", "optim.micro_batch_size=3"),
    ],
    ids=["grpo", "conspo", "grpo-micro3"],
)
def test_skipping_inert_rows_gives_the_full_batch_update(fast_cfg, applied_grads, overrides):
    a, b = _pair(fast_cfg, "rollout.prompts_per_step=6", "train.overlong_mask=false", *overrides)
    col = a.collect()
    assert 0 < _degenerate_groups(col) < 6  # some groups inert, some not
    seen_a, seen_b = _counting(a), _counting(b)
    ga, ma = applied_grads(a, lambda: a.update(col))
    gb, mb = applied_grads(b, lambda: b.update(col))
    assert sum(seen_b) == 24 and sum(seen_a) == 24 - 4 * _degenerate_groups(col)
    assert ma["update/skipped_rows"] == pytest.approx(_degenerate_groups(col) / 6)
    assert "update/skipped_rows" not in mb
    assert ga.keys() == gb.keys() and ga
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], atol=1e-7, rtol=1e-5)
    assert any(bool(g.abs().max() > 1e-4) for g in ga.values())  # a real gradient


def test_a_step_with_every_group_degenerate_trains_one_row_and_steps_as_before(
    fast_cfg, applied_grads
):
    """All-equal rewards everywhere: one row is forwarded (so every parameter gets its zero
    gradient) and Adam's momentum moves the weights exactly as on the full batch."""
    a, b = _pair(fast_cfg, "algo.preset=grpo")
    first, skips = a.collect(), a.skips  # varied rewards: Adam's moments become non-zero
    a.skips = None  # (the same first update on both, bit for bit)
    a.update(first), b.update(first)
    a.skips = skips
    flat = dataclasses.replace(a.collect(), rewards=torch.zeros(16))  # every group alike
    seen, before = _counting(a), {k: v.detach().clone() for k, v in a.model.named_parameters()}
    ga, ma = applied_grads(a, lambda: a.update(flat))
    gb, mb = applied_grads(b, lambda: b.update(flat))
    assert seen == [1] and ma["update/skipped_rows"] == pytest.approx(15 / 16)
    assert 4 * ma["flops/update"] < mb["flops/update"]  # the FLOP count sees the saving
    assert ga.keys() == gb.keys() and all(bool((g == 0).all()) for g in ga.values())
    for (k, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=0.0, rtol=0.0, msg=k)
        assert not torch.equal(pa, before[k]), k  # Adam's momentum moved every weight


def test_rows_cut_at_the_cap_are_skipped_under_overlong_masking(fast_cfg, applied_grads):
    """Every response runs to max_new_tokens: overlong masking empties every loss mask,
    one row is forwarded and the (zero) gradient is the full batch's bit for bit."""
    over = ("algo.preset=grpo", "rollout.min_new_tokens=4", "train.overlong_mask=true")
    a, b = _pair(fast_cfg, *over)
    col = a.collect()
    assert col.rewards.std() > 0  # (rewards vary: only the empty masks make the rows inert)
    seen_a, seen_b = _counting(a), _counting(b)
    ga, _ = applied_grads(a, lambda: a.update(col))
    gb, _ = applied_grads(b, lambda: b.update(col))
    assert seen_a == [1] and sum(seen_b) == 16
    assert ga.keys() == gb.keys() and gb
    for k in gb:
        torch.testing.assert_close(ga[k], gb[k], atol=0.0, rtol=0.0)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (("optim.skip_inert_rows=false",), "optim.skip_inert_rows is false"),
        (("algo.kl_coef=0.1",), "a KL, entropy or distillation term reads every row"),
        (("algo.entropy_coef=0.01",), "a KL, entropy or distillation term reads every row"),
        (("algo.preset=hard_pair_grpo",), "'hard_pair_grpo' is not linear in the advantage"),
        (("algo.preset=ppo",), "step component 'critic' takes part in every micro-batch"),
    ],
)
def test_why_rows_are_not_skipped(fast_cfg, overrides, why):
    """Where a zero-advantage or empty row still moves the weights, every row trains."""
    tr = Trainer(fast_cfg(*overrides), reward_fn=parity_reward)
    assert why in why_not(tr.cfg, tr.recipe, tr.components, 1) and tr.skips is None
    ok = Trainer(fast_cfg(), reward_fn=parity_reward)
    assert why_not(ok.cfg, ok.recipe, ok.components, 2).startswith("data-parallel")
    assert ok.skips is False  # grpo: row by row


def test_with_a_kl_term_zero_advantage_rows_train(fast_cfg):
    a = Trainer(fast_cfg("algo.kl_coef=0.1", "train.overlong_mask=false"), reward_fn=parity_reward)
    col = a.collect()
    assert _degenerate_groups(col) > 0
    seen = _counting(a)
    m = a.update(col)
    assert sum(seen) == 16 and "update/skipped_rows" not in m


def test_inert_rows_by_hand():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv = torch.tensor(
        [[0.0, 0.0, 5.0], [1.0, 1.0, 1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, -1.0, 0.0],
         [float("nan"), 0.0, 0.0]]
    )  # fmt: skip
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    every = torch.ones(6, dtype=torch.bool)
    # row 0: zero where valid (5.0 is masked); row 1: empty mask; row 3: zero; row 5: NaN
    assert inert_rows(mask, adv, groups, every, False).tolist() == [1, 1, 0, 1, 0, 0]
    # by group: group 0 alone is inert throughout
    assert inert_rows(mask, adv, groups, every, True).tolist() == [1, 1, 0, 0, 0, 0]
    # [N] advantages (an empty mask is inert whatever its advantage); rows not trained are
    # never returned; never every trained row: the first trained row (group) is kept
    row_adv = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    trained = torch.tensor([False, True, True, True, True, True])
    assert inert_rows(mask, row_adv, groups, trained, False).tolist() == [0, 1, 0, 1, 1, 1]
    flat, trained = torch.zeros(6), torch.tensor([False, False, True, True, True, True])
    assert inert_rows(mask, flat, groups, trained, False).tolist() == [0, 0, 0, 1, 1, 1]
    assert inert_rows(mask, flat, groups, trained, True).tolist() == [0, 0, 0, 0, 1, 1]
