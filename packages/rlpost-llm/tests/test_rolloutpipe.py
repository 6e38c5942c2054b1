"""RolloutPipe (004-30, train.pipeline rolloutpipe): each chunk of complete groups is
back-propagated as soon as it is generated, before the step's later groups exist, and the
deferred normaliser makes the step's update equal the synchronous one on the same groups."""

import threading

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.trainer import Trainer


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


@pytest.mark.parametrize(
    "preset, extra",
    [
        ("grpo", ["algo.kl_coef=0.05"]),  # seq-mean-token-mean, a reference KL in the loss
        ("dapo", []),  # token-mean, dynamic sampling
        ("dr_grpo", []),  # the constant (generation budget) normaliser
        ("rloo", []),  # seq-mean-token-sum
        ("lpo", []),  # a loss coupling the rows of a group
    ],
)
def test_the_pipelined_update_equals_the_synchronous_one(fast_cfg, applied_grads, preset, extra):
    cfg = fast_cfg(f"algo.preset={preset}", "train.pipeline=rolloutpipe",
                   "train.stream_prompts=1", "rollout.max_new_tokens=6", *extra)  # fmt: skip
    torch.manual_seed(0)
    tr = Trainer(cfg, reward_fn=parity)
    parts = []
    while len(parts) < 4:  # four one-group chunks whose rewards differ
        c = tr.collect(1)
        if len(c.batch) and float(c.rewards.std()) > 0:
            parts.append(c)
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    sync_grads, sync = applied_grads(tr, lambda: tr.update(Collected.concat(parts)))
    tr.model.load_state_dict(start)  # the same weights again (Adam's state plays no part)
    given = iter(parts)
    tr.rollouts.inner.collect = lambda want=None, given_=None: next(given)
    pipe_grads, got = applied_grads(tr, lambda: tr.rollouts.step(tr.total_steps))
    col, piped = got.col, got.update
    assert len(col.batch) == 4 * 4 and piped["pipe/chunks"] == 4.0
    assert sync_grads.keys() == pipe_grads.keys() and sync_grads
    for k, g in sync_grads.items():
        torch.testing.assert_close(pipe_grads[k], g, rtol=1e-4, atol=1e-7, msg=k)
    for k in ("grad_norm", "tokens/trained", "response_length", "adv_abs_mean", "entropy"):
        assert piped[k] == pytest.approx(sync[k], rel=1e-4), k
    tr.close()


def test_groups_train_whole_while_later_groups_are_still_generating(fast_cfg):
    """The generator of chunk 2 onwards waits until the trainer has back-propagated chunk
    1: a trainer that waited for the whole batch (no pipelining) would never get there."""
    cfg = fast_cfg("train.pipeline=rolloutpipe", "train.stream_prompts=1", "train.steps=2")
    tr = Trainer(cfg, reward_fn=parity)
    first_trained = threading.Event()
    source = tr.rollouts.inner  # the generator the pipeline asks for chunks
    collect, backward = source.collect, tr.updater.backward
    produced, trained, stalls = [], [], []

    def gated_collect(want=None, given=None):
        if produced and not first_trained.wait(timeout=60):
            stalls.append(len(produced))
        part = collect(want, given)
        produced.append(part)
        return part

    def recording_backward(step, rows, *a):
        b = step.batch
        labels, counts = b.group.unique(return_counts=True)
        trained.append((len(labels), counts.tolist(), list(b.finish_reasons)))
        first_trained.set()
        return backward(step, rows, *a)

    source.collect, tr.updater.backward = gated_collect, recording_backward
    result = tr.train()
    assert result["steps"] == 2 and not stalls
    assert len(trained) == 2 * 4  # one chunk of one group each, four a step
    for n_groups, counts, finish in trained:  # whole groups of finished responses
        assert n_groups == 1 and counts == [4]
        assert all(f in ("stop", "length") for f in finish)


def test_rolloutpipe_trains_from_the_config(fast_cfg):
    from rlpost.llm.tools.runlog import read_metrics

    cfg = fast_cfg("train.pipeline=rolloutpipe", "train.stream_prompts=2", "train.steps=3")
    res = Trainer(cfg, reward_fn=parity).train()
    assert res["steps"] == 3 and res["staleness_histogram"] == {0: 3}
    rows = [r for r in read_metrics(cfg.run.dir) if "accuracy" in r]
    assert len(rows) == 3
    for r in rows:
        assert r["pipe/chunks"] == 2.0 and r["policy_version"] >= 1
        assert 0.0 <= r["time/trainer_idle"] <= 1.0 and r["time/rollouts_per_s"] > 0
    assert rows[-1]["policy_version"] == 3 - rows[-1]["skipped_steps"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.preset=reinforce_pp"], "reads the whole step batch"),
        (["algo.preset=ess_adaptive", "optim.micro_batch_size=128"], "reads the whole step"),
        (["algo.preset=fade"], "dynamics"),
        (["optim.updates_per_batch=2"], "updates_per_batch"),
        (["rollout.engine=vllm"], "hf engine only"),
    ],
)
def test_rolloutpipe_refuses_what_reads_more_than_a_group(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, ["train.pipeline=rolloutpipe", *overrides])


def test_rolloutpipe_resumes_exactly(fast_cfg, tmp_path):
    """A step is whole at its end (its chunks generated, trained and applied), so a run
    stopped after its step-2 checkpoint and resumed ends on the uninterrupted weights."""
    over = ["train.pipeline=rolloutpipe", "train.stream_prompts=2", "train.steps=4",
            "run.save_every=2"]  # fmt: skip
    ref = Trainer(fast_cfg(*over, f"run.dir={tmp_path / 'ref'}"), reward_fn=parity)
    ref.train()
    cut = fast_cfg(*over, f"run.dir={tmp_path / 'cut'}")
    first = Trainer(cut, reward_fn=parity)
    first.train(until=2)  # the step-2 checkpoint is written; the process "dies" here
    first.close()
    resumed = Trainer(cut, reward_fn=parity, resume=True)
    assert resumed.step == 2
    resumed.train()
    a, b = ref.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
