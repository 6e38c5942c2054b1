"""VIGOR (001-03): batched per-sample gradient norms equal a per-sample backward loop; the
sqrt(T) correction removes the length trend where token gradients are independent; the
group-wise rank shaping; a step's rewards come from the policy's own gradients."""

from __future__ import annotations

import types

import pytest
import torch

from rlpost.core.intrinsic import group_rank_rewards, length_corrected
from rlpost.llm.config import load_config
from rlpost.llm.model.per_sample import grad_norms
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.train.inputs import Role
from rlpost.llm.trainer import Trainer


def test_group_rank_rewards_favour_the_smallest_score_within_each_group():
    scores = torch.tensor([3.0, 1.0, 2.0, 5.0, 5.0, 7.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2])
    r = group_rank_rewards(scores, group)
    assert r.tolist() == [0.0, 1.0, 0.5, 0.5, 0.5, 0.5]  # ties share; a lone row: 0.5
    big = group_rank_rewards(scores * 1000 + 7, group)
    assert torch.equal(r, big)  # the same reward whatever the prompt's score scale
    assert torch.equal(
        length_corrected(torch.tensor([2.0]), torch.tensor([16])), torch.tensor([8.0])
    )


def _batch(tok, lengths_p, lengths_c, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 20, (n,), generator=g).tolist() for n in lengths_p]
    L = max(lengths_c)
    ids = torch.full((len(lengths_c), L), tok.pad_token_id)
    mask = torch.zeros(len(lengths_c), L)
    for i, n in enumerate(lengths_c):
        ids[i, :n] = torch.randint(3, 20, (n,), generator=g)
        mask[i, :n] = 1
    return make_seq_batch(prompts, ids, mask, tok.pad_token_id), prompts, ids, mask


def test_batched_per_sample_norms_equal_a_per_sample_backward_loop(fast_cfg):
    tr = Trainer(fast_cfg())
    model, tok = tr.model, tr.tok
    sb, prompts, ids, mask = _batch(tok, [3, 5, 2, 4, 6], [4, 2, 6, 1, 5])
    batched = grad_norms(model, sb, mask, temperature=0.7, chunk=2)
    loop = []
    for i in range(len(prompts)):  # the plain way: one row, the model's own mask, backward
        model.zero_grad()
        one = make_seq_batch([prompts[i]], ids[i : i + 1], mask[i : i + 1], tok.pad_token_id)
        logp = completion_logprobs(model, one, 0.7, impl="logits")[0]
        (-(logp * mask[i]).sum() / mask[i].sum()).backward()
        loop.append(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters())))
    assert torch.allclose(batched, torch.stack(loop), rtol=1e-4, atol=1e-6)
    tr.close()


class _Uniform(torch.nn.Module):
    """A bigram LM predicting uniformly: on uniform random tokens each token's NLL
    gradient has mean zero and the tokens' gradients are independent, so the mean-NLL
    gradient norm falls like 1/sqrt(T)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(vocab, vocab))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return types.SimpleNamespace(logits=self.table[input_ids])


def _slope(y: torch.Tensor, x: torch.Tensor) -> float:
    lx, ly = x.float().log(), y.log()
    lx = lx - lx.mean()
    return float((lx * (ly - ly.mean())).sum() / (lx * lx).sum())


def test_the_length_correction_removes_the_length_trend_on_constant_content_inputs():
    V, g = 16, torch.Generator().manual_seed(0)
    lengths = torch.tensor([T for T in (4, 8, 16, 32, 64, 128) for _ in range(24)])
    L = int(lengths.max())
    ids = torch.randint(0, V, (len(lengths), L), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]).float()
    sb = make_seq_batch([[1]] * len(lengths), ids, mask, pad_id=0)
    norms = grad_norms(_Uniform(V), sb, mask, chunk=48)
    raw, corrected = _slope(norms, lengths), _slope(length_corrected(norms, lengths), lengths)
    assert raw == pytest.approx(-0.5, abs=0.1)  # the averaged gradient's length bias
    assert abs(corrected) < 0.1  # gone after sqrt(T)


def test_a_step_with_vigor_trains_on_the_rank_of_its_gradient_norms(fast_cfg):
    tr = Trainer(fast_cfg("algo.vigor={}"))
    col = tr.rollouts.collect()
    step = tr.step_inputs(col)
    r = step[Role.REWARDS]
    sb = tr.forwards.seq_batch(col.batch, pack=False)
    norms = grad_norms(tr.model, sb, col.batch.mask, tr.sampling.temperature)
    want = group_rank_rewards(length_corrected(norms, col.batch.mask.sum(1)), col.batch.group)
    assert torch.allclose(r, want) and ((r >= 0) & (r <= 1)).all()
    assert {"vigor/grad_norm", "vigor/length_corr"} <= set(step.metrics)
    tr.close()


def test_the_confidence_signal_ranks_by_the_mean_token_logprob(fast_cfg):
    tr = Trainer(fast_cfg("algo.vigor={signal: confidence}"))
    col = tr.rollouts.collect()
    b = col.batch
    conf = (b.logprobs * b.mask).sum(1) / b.mask.sum(1)
    assert torch.equal(tr.step_inputs(col)[Role.REWARDS], group_rank_rewards(-conf, b.group))
    tr.close()


def test_vigor_loads_from_the_cli_and_refuses_bad_settings(fast_overrides):
    load_config(None, [*fast_overrides, "algo.vigor={mix: 0.5}"])
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        load_config(None, [*fast_overrides, "algo.vigor={chunk: 0}"])
