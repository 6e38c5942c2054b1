"""model.batch_invariant: a row's float32 log-probs do not depend on which rows share its
forward, so scoring at micro-batch 1, 8 or 64 gives the same bits, and the training
forward equals the no-grad scoring (the on-policy ratio is exactly 1); the engine's
log-probs agree with the trainer's to float rounding, and the share that drifts is logged
(``mismatch/drifted``)."""

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.train.forward import Forwards
from rlpost.llm.trainer import Trainer


def parity(completion, example):
    return float(len(completion) % 2 == 0)


@pytest.mark.parametrize(
    "layout", [[], ["model.pack_layout=uniform"], ["model.pack_prompts=false"]]
)
def test_log_probs_are_bitwise_the_same_at_any_micro_batch_size(fast_overrides, tmp_path, layout):
    over = [*fast_overrides, f"run.dir={tmp_path}", "rollout.max_new_tokens=8", *layout]
    tr = Trainer(load_config(None, [*over, "model.batch_invariant=true"]), reward_fn=parity)
    col = tr.collect()

    def scored(invariant: bool, mbs: int) -> torch.Tensor:
        cfg = load_config(None, [*over, f"model.batch_invariant={invariant}",
                                 f"optim.micro_batch_size={mbs}"])  # fmt: skip
        return Forwards(cfg, tr.learner, tr.model, 1.0).nograd(tr.model, col.batch).logp

    one = scored(True, 1)
    assert torch.equal(one, scored(True, 8)) and torch.equal(one, scored(True, 64))
    # the training forward (with grad, one micro-batch of 8 rows) gives the same bits
    sub = col.batch.select(torch.arange(8))
    trained = tr.forwards.train(sub)[0].detach() * sub.mask
    assert torch.equal(trained, one[:8])
    # without it, the same rows in other company differ by float rounding only
    shared = scored(False, 64)
    assert (shared - one).abs().max() < 1e-5
    tr.close()


def test_the_engine_and_the_trainer_agree_and_the_drift_is_logged(fast_cfg):
    tr = Trainer(fast_cfg("model.batch_invariant=true", "train.steps=1"), reward_fn=parity)
    col = tr.collect()
    m = tr.update(col)
    assert m["mismatch/abs_max"] < 1e-5  # the HF engine generated on the same weights
    assert 0.0 <= m["mismatch/drifted"] <= 1.0
    tr.close()
