"""DORA's multi-version streaming (train.pipeline dora): every trajectory comes from one
weights version, the staleness bound holds, chunks are taken in order and split exactly."""

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.rollout.stream import ChunkStream
from rlpost.llm.trainer import Trainer


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


class Chunks:
    """A producer of ``(serial, version, groups)`` chunks, the version read at production."""

    def __init__(self, groups: int = 2, seconds: float = 0.0):
        self.version, self.serial, self.groups = 0, 0, groups
        self.calls, self.seconds = 0, seconds

    def __call__(self):
        time.sleep(self.seconds)
        self.calls += 1
        self.serial += 1
        return (self.serial, self.version, list(range(self.groups)))


def _stream(src: Chunks, capacity: int = 2, start: list | None = None) -> ChunkStream:
    return ChunkStream(
        src,
        size=lambda c: len(c[2]),
        version=lambda c: c[1],
        split=lambda c, k: ((c[0], c[1], c[2][:k]), (c[0], c[1], c[2][k:])),
        capacity=capacity,
        start=start,
    )


def test_take_is_fifo_splits_the_surplus_and_drops_stale_chunks():
    src = Chunks(groups=2)
    s = _stream(src, capacity=4)
    try:
        parts, dropped = s.take(3, version=0, max_stale=1)  # 2 + 1 of the next, 1 carried
        assert [(p[0], len(p[2])) for p in parts] == [(1, 2), (2, 1)] and dropped == 0
        parts, _ = s.take(1, version=0, max_stale=1)
        assert [(p[0], p[2]) for p in parts] == [(2, [1])]  # the carried group, in order
        time.sleep(0.2)  # the queue fills with version-0 chunks
        with s.exclusive():
            src.version = 3  # new weights: the queued chunks are now 3 versions old
        parts, dropped = s.take(2, version=3, max_stale=1)
        assert all(p[1] == 3 for p in parts)  # only fresh chunks trained
        assert dropped >= 2 and dropped % 2 == 0  # whole stale chunks dropped
    finally:
        s.close()


def test_no_chunk_is_produced_inside_exclusive():
    src = Chunks(seconds=0.002)
    s = _stream(src, capacity=10_000)
    try:
        time.sleep(0.05)
        with s.exclusive():
            before = src.calls
            time.sleep(0.1)
            assert src.calls == before
        time.sleep(0.05)
        assert src.calls > before  # and it resumes afterwards
    finally:
        s.close()


def test_a_producer_error_reaches_the_consumer():
    def boom():
        raise ValueError("generation failed")

    s = ChunkStream(boom, len, lambda c: 0, lambda c, k: (c, c), capacity=1)
    with pytest.raises(ValueError, match="generation failed"):
        s.take(1, 0, 0)
    s.close()


def test_a_snapshot_restored_into_a_new_stream_loses_and_repeats_no_chunk():
    """Before: a stream had no state; a resumed DORA run lost every chunk queued, split or
    in hand at the checkpoint (their prompts already drawn) and generated new ones."""
    src = Chunks(groups=2)
    s = _stream(src, capacity=1)
    parts, _ = s.take(3, version=0, max_stale=9)  # chunk 2 split: one group carried
    time.sleep(0.2)  # one chunk queued, one produced and waiting for room
    with s.exclusive():
        saved = s.snapshot()
    s.close()
    assert [c[0] for c in saved] == [2, 3, 4] and saved[0][2] == [1]  # carry, queue, hand
    with pytest.raises(RuntimeError, match="outside exclusive"):
        s.snapshot()
    resumed = _stream(src, capacity=1, start=saved)  # the producer continues where it was
    try:
        later, _ = resumed.take(7, version=0, max_stale=9)
    finally:
        resumed.close()
    groups = [(c[0], g) for c in [*parts, *later] for g in c[2]]
    assert groups == [(i // 2 + 1, i % 2) for i in range(10)]  # every group once, in order


def test_several_producers_feed_one_queue_and_exclusive_waits_for_every_one():
    """DORA's generators, one per Ray worker: each thread's chunks reach the one queue;
    inside exclusive() none of them produces, and a snapshot holds every one's chunk in
    hand, so a restored stream loses none."""
    slow, fast = Chunks(seconds=0.02), Chunks(seconds=0.002)
    fast.serial = 1000  # (tells the producers' chunks apart)
    s = ChunkStream(
        [slow, fast],
        size=lambda c: len(c[2]),
        version=lambda c: c[1],
        split=lambda c, k: ((c[0], c[1], c[2][:k]), (c[0], c[1], c[2][k:])),
        capacity=1,
    )
    try:
        got: list = []
        while {c[0] // 1000 for c in got} != {0, 1}:
            got += s.take(2, version=0, max_stale=9)[0]
        time.sleep(0.1)  # the queue full, both producers holding a chunk
        with s.exclusive():
            before = (slow.calls, fast.calls)
            time.sleep(0.1)
            assert (slow.calls, fast.calls) == before
            saved = s.snapshot()
        assert {c[0] // 1000 for c in saved} == {0, 1} and len(saved) == 3  # queue + 2 hands
    finally:
        s.close()
    produced = sorted((c[0], g) for c in [*got, *saved] for g in c[2])
    made = [(i, g) for i in range(1, slow.serial + 1) for g in (0, 1)]
    made += [(i, g) for i in range(1001, fast.serial + 1) for g in (0, 1)]
    assert produced == sorted(made)  # every group produced was taken or saved, none twice


class RecordingEngine:
    """Wraps the trainer's engine: each generate call's version at its start and end, and
    a weight load that lands while a call is running."""

    def __init__(self, engine):
        self.engine, self.calls, self.overlaps = engine, [], 0
        self._busy = threading.Event()

    def generate(self, prompts, n, sampling):
        self._busy.set()
        try:
            v0 = self.engine.policy_version
            time.sleep(0.02)  # widen the window a racing weight load would hit
            out = self.engine.generate(prompts, n, sampling)
            self.calls.append((v0, self.engine.policy_version, out.policy_version))
            return out
        finally:
            self._busy.clear()

    def update_weights(self, state_dict, version):
        if self._busy.is_set():
            self.overlaps += 1
        self.engine.update_weights(state_dict, version)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_dora_trajectories_are_single_version_and_staleness_is_bounded(fast_cfg):
    cfg = fast_cfg(
        "train.pipeline=dora",
        "train.stream_prompts=1",
        "train.max_staleness=1",
        "train.steps=6",
    )
    tr = Trainer(cfg, reward_fn=parity)
    rec = RecordingEngine(tr.engine)
    tr.engine = rec
    seen = []
    update = tr.update

    def checked(col):
        seen.append((tr.version, col.batch.row_versions.clone()))
        return update(col)

    tr.update = checked
    result = tr.train()
    assert result["steps"] == 6 and len(seen) == 6
    assert rec.overlaps == 0, "weights were loaded while a chunk was being generated"
    assert rec.calls and all(v0 == v1 == tagged for v0, v1, tagged in rec.calls)
    for version, rows in seen:
        assert len(rows) == 4 * 4  # prompts_per_step groups of group_size rows
        stale = version - rows
        assert int(stale.min()) >= 0 and int(stale.max()) <= 1
    assert max(result["staleness_histogram"]) <= 1
    # rows of a group share one version (a chunk is whole groups)
    assert all(bool((g == g[0]).all()) for _, rows in seen for g in rows.view(4, 4))


def test_a_resumed_dora_run_trains_first_on_the_chunks_its_checkpoint_holds(fast_cfg):
    """Before: the chunks produced ahead at a checkpoint were lost (their prompts already
    drawn: the resumed run skipped them) and the data position and RNG were read while the
    next chunk was being generated. Later chunks' versions follow thread timing, as in any
    DORA run, so the test compares what the checkpoint fixes: the step after it trains on
    the saved chunks first, then on the prompts the uninterrupted run drew next."""
    import json

    from rlpost.core.io.checkpoint import load_tensors
    from rlpost.llm.rollout.collected import Collected, CollectedBuffer

    args = ["train.pipeline=dora", "train.stream_prompts=1", "train.max_staleness=8",
            "train.steps=3", "run.save_every=2"]  # fmt: skip

    def run(resume: bool) -> dict:
        tr = Trainer(fast_cfg(*args), reward_fn=parity, resume=resume)
        seen, update = {}, tr.update

        def recording(col):
            seen[tr.step] = col
            return update(col)

        tr.update = recording
        tr.train()
        return seen

    uninterrupted = run(False)
    ckpt = fast_cfg().run.dir + "/checkpoints/step-000002"
    buffer = CollectedBuffer("stream")
    buffer.load(
        load_tensors(Path(ckpt)), json.loads((Path(ckpt) / "state.json").read_text())["stream"]
    )
    assert buffer.items, "the producer had run ahead by the checkpoint"
    saved = Collected.concat(buffer.items)
    shutil.rmtree(Path(ckpt).parent / "step-000003")
    resumed = run(True)
    assert list(resumed) == [2]  # (tr.step before the update: the third step)
    first = resumed[2]
    n = min(len(saved.batch), len(first.batch))
    assert torch.equal(first.batch.completion_ids[:n], saved.batch.completion_ids[:n])
    assert torch.equal(first.batch.row_versions[:n], saved.batch.row_versions[:n])
    prompts = [[e.prompt for e in c.examples] for c in (uninterrupted[2], first)]
    assert prompts[0] == prompts[1]  # nothing skipped, nothing drawn twice


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.preset=fbos"], "feedback rounds"),
        (["train.async_rollouts=true"], "one_step_off pipeline, not dora"),
        (["rollout.engine=vllm"], "hf engine only"),
    ],
)
def test_dora_refuses_what_it_cannot_stream(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, ["train.pipeline=dora", *overrides])


def test_one_step_off_is_async_rollouts():
    assert load_config(None, ["train.async_rollouts=true"]).train.pipeline == "one_step_off"
    assert load_config(None, ["train.pipeline=one_step_off"]).train.async_rollouts
