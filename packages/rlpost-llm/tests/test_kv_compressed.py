"""Rollouts under a compressed KV cache (001-13, rollout.kv_compression): the learner's
shadow mask reproduces the sampler's policy exactly, the cache stays bounded, and the
correction is the identity when nothing is compressed."""

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.model.policy import completion_logprobs, load_policy, make_seq_batch
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.hf import HFEngine
from rlpost.llm.rollout.engines.kv_compressed import KVCompressedEngine, shadow_mask
from rlpost.llm.trainer import Trainer


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return load_policy(load_config(None, ["model.path=tiny-random", "run.progress=false"]))


def _prompts(tok):
    return [tok.encode("12+34="), tok.encode("7+5="), tok.encode("100+250+9=")]


def _logprobs(model, b, kv):
    sb = make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id, kv=kv)
    with torch.no_grad():
        return completion_logprobs(model, sb, 1.0)[0] * b.mask


@pytest.mark.parametrize("sink, window", [(1, 3), (0, 2), (2, 5)])
def test_the_shadow_forward_is_the_samplers_policy(policy, sink, window):
    model, tok = policy
    torch.manual_seed(1)
    eng = KVCompressedEngine(model, tok, sink, window)
    b = eng.generate(_prompts(tok), 4, SamplingParams(max_new_tokens=10, temperature=1.0))
    assert int(b.mask.sum(1).max()) > window  # the window is exceeded: entries evicted
    shadow = _logprobs(model, b, (sink, window))
    torch.testing.assert_close(shadow, b.logprobs * b.mask, atol=2e-5, rtol=0)
    dense = _logprobs(model, b, None)
    assert float((dense - shadow).abs().max()) > 1e-2  # the bias a dense learner would see
    P = max(len(p) for p in _prompts(tok))
    assert eng.stats["cache_columns_max"] <= P + sink + window + 1  # evicted, not masked


def test_no_compression_samples_as_the_dense_engine(policy):
    model, tok = policy
    sp = SamplingParams(max_new_tokens=8, temperature=0)  # greedy: comparable token by token
    ref = HFEngine(model, tok).generate(_prompts(tok), 1, sp)
    b = KVCompressedEngine(model, tok, sink=0, window=10_000).generate(_prompts(tok), 1, sp)
    assert torch.equal(b.completion_ids, ref.completion_ids)
    torch.testing.assert_close(b.logprobs * b.mask, ref.logprobs * ref.mask, atol=2e-5, rtol=0)


def test_shadow_mask_is_causal_dense_over_the_prompt_and_bounded_after():
    att = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])  # one left pad, 3 prompt + 3 completion
    m = shadow_mask(att, prompt_width=4, sink=1, window=2)[0, 0]
    assert m[3, 1:4].tolist() == [True, True, True]  # the last prompt token: dense
    assert m[6].tolist() == [False, True, False, False, False, True, True, False]  # sink + 2
    assert not m[:7, 7].any() and not m[1:, 0].any()  # padding is attended by no real token
    assert m.any(-1).all()  # every row attends to something: no NaN from a softmax


@pytest.mark.parametrize("window, identity", [(10_000, True), (2, False)])
def test_the_correction_is_the_identity_at_zero_compression(
    fast_cfg, applied_grads, window, identity
):
    cfg = fast_cfg("rollout.kv_compression.sink=0", f"rollout.kv_compression.window={window}",
                   "rollout.kv_compression.distill=0.5", "rollout.max_new_tokens=8")  # fmt: skip
    tr = Trainer(cfg, reward_fn=parity)
    col = tr.collect()
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    corrected, _ = applied_grads(tr, lambda: tr.update(col))  # shadow view + distillation
    tr.model.load_state_dict(start)
    tr.forwards.kv = None  # the plain learner: dense context, no distillation
    plain, _ = applied_grads(tr, lambda: tr.update(col))
    assert corrected.keys() == plain.keys() and plain
    same = all(torch.allclose(corrected[k], plain[k], rtol=1e-4, atol=1e-7) for k in plain)
    assert same == identity
    tr.close()


def test_kv_compressed_rollouts_train_from_the_config(fast_cfg):
    from rlpost.llm.tools.runlog import read_metrics

    cfg = fast_cfg("rollout.kv_compression.sink=1", "rollout.kv_compression.window=3",
                   "rollout.kv_compression.distill=0.1", "rollout.max_new_tokens=6")  # fmt: skip
    Trainer(cfg, reward_fn=parity).train()
    rows = [r for r in read_metrics(cfg.run.dir) if "accuracy" in r]
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["kv/cache_fraction"] < 1 and r["kv/dense_gap"] > 0
        assert r["mismatch/abs_mean"] < 1e-4  # the learner scores what the sampler sampled


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.engine=vllm"], "vllm"),
        (["rollout.workers=2"], "rollout.workers"),
        (["train.pipeline=rolloutpipe"], "rolloutpipe"),
        (["rollout.kv_compression.window=0"], "greater than or equal to 1"),
    ],
)
def test_kv_compression_refuses_what_it_cannot_shadow(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, ["rollout.kv_compression.sink=2", *overrides])
