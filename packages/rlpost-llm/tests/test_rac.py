"""RAC (000-19): the ranking-aware and clean/corrupted confidence losses are zero when the
confidence order matches the quality order and positive otherwise; their gradients match
a hand-worked case; micro-batches add up to the full batch; the corruption masks digits."""

from __future__ import annotations

import random

import pytest
import torch

from rlpost.core.confidence import corruption_loss, ranking_loss, sequence_confidence
from rlpost.llm.config import load_config
from rlpost.llm.data.corruption import corrupt_prompt, mask_digits
from rlpost.llm.trainer import Trainer


def test_the_ranking_loss_is_zero_when_confidence_follows_quality_and_positive_otherwise():
    q = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1])  # group 1: all equal, no ordered pair
    ordered = torch.tensor([-0.1, -2.0, -1.0, -5.0, -0.2])
    assert ranking_loss(ordered, q, g) == 0
    inverted = torch.tensor([-2.0, -0.1, -1.0, -5.0, -0.2], requires_grad=True)
    loss = ranking_loss(inverted, q, g)
    # group 0's pairs: (0>1) 1.9, (0>2) 1.0, (2>1) 0.9, mean 3.8 / 3; group 1: nothing
    assert loss.item() == pytest.approx(3.8 / 3)
    loss.backward()  # d/dc_i: -(pairs i wins and loses) + (pairs i loses and violates)
    assert torch.allclose(inverted.grad, torch.tensor([-2, 2, 0, 0, 0]) / 3)
    assert ranking_loss(ordered, q, g, margin=1.0) > 0  # a margin asks for a gap too
    flat = torch.zeros(4, requires_grad=True)  # a degenerate group: 0, finite gradient
    out = ranking_loss(flat, torch.ones(4), torch.zeros(4, dtype=torch.long))
    out.backward()
    assert out == 0 and torch.isfinite(flat.grad).all()


def test_the_corruption_loss_is_zero_when_corrupted_confidence_is_lower():
    clean = torch.tensor([-0.5, -1.0])
    assert corruption_loss(clean, clean - 0.3) == 0
    assert corruption_loss(clean, torch.tensor([-0.2, -1.5])).item() == pytest.approx(0.3)


def test_confidence_is_the_mean_token_logprob_of_the_response():
    logp = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_confidence(logp, mask).tolist() == [-2.0, -2.0]


def test_the_corruption_masks_digits_of_text_and_user_turns():
    rng = random.Random(0)
    out = mask_digits("12+34=", 1.0, rng)
    assert out == "  +  ="
    once = mask_digits("12+34=", 1e-9, rng)  # at least one digit, always
    assert sum(a != b for a, b in zip(once, "12+34=", strict=True)) == 1
    chat = corrupt_prompt([{"role": "system", "content": "7"}, {"role": "user", "content": "9"}],
                          1.0, rng, "_")  # fmt: skip
    assert chat == [{"role": "system", "content": "7"}, {"role": "user", "content": "_"}]


def _one_first(completion: str, example) -> float:
    return float(completion.startswith("1"))


def test_rac_adds_its_losses_and_micro_batches_sum_to_the_full_batch(fast_cfg, applied_grads):
    grads = {}
    for mbs in (16, 4):  # one micro-batch, or one per group
        tr = Trainer(fast_cfg("algo.rac={rank: 1.0, pair: 1.0}", f"optim.micro_batch_size={mbs}",
                              "optim.grad_clip=1e9"), reward_fn=_one_first)  # fmt: skip
        col = tr.rollouts.collect()
        grads[mbs], m = applied_grads(tr, lambda tr=tr, col=col: tr.update(col))
        assert "rac/rank_loss" in m and "rac/confidence_drop" in m
        tr.close()
    for name, g in grads[16].items():
        assert torch.allclose(g, grads[4][name], atol=1e-6, rtol=1e-4), name


def test_rac_loads_from_the_cli_and_refuses_bad_settings(fast_overrides):
    load_config(None, [*fast_overrides, "algo.rac={}"])
    with pytest.raises(ValueError, match="mask_rate"):
        load_config(None, [*fast_overrides, "algo.rac={mask_rate: 0}"])
    with pytest.raises(ValueError, match="one > 0"):
        load_config(None, [*fast_overrides, "algo.rac={rank: 0, pair: 0}"])


@pytest.mark.parametrize("own", [True, False])
def test_the_corrupted_side_is_the_policys_answer_or_the_same_response(fast_cfg, own):
    tr = Trainer(fast_cfg(f"algo.rac={{pair_sample: {str(own).lower()}, mask_rate: 1.0}}"),
                 reward_fn=_one_first)  # fmt: skip
    col = tr.rollouts.collect()
    tr.step_inputs(col)  # the providers' and hooks' provide phase
    hook = next(c for c in tr.components.items if c.name == "rac")
    c = hook._corrupt
    for i in range(len(col.batch)):
        text = tr.tok.decode(c.prompt_ids[i])
        assert not any(ch.isdigit() for ch in text)  # every digit masked at rate 1
        assert len(text) == len(col.examples[i].prompt)
    same = torch.equal(c.completion_ids, col.batch.completion_ids)
    assert same != own and len(c) == len(col.batch)  # own: freshly sampled answers
    tr.close()
