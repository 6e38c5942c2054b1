"""DORA's multi-version streaming (001-29): a generator thread streams chunks of
``train.stream_prompts`` groups without pause, each chunk wholly from one weights version
(new weights load between chunks, :class:`~rlpost.llm.rollout.stream.ChunkStream`); a
step trains on the next ``prompts_per_step`` groups in arrival order, so its rows may come
from several versions, and groups more than ``train.max_staleness`` versions old are
dropped (``dora/dropped_groups``).

With Ray rollout workers (``rollout.workers`` >= 2) each worker is a generator of its
own: one producer thread per worker streams its chunks, and after an update the new
weights are only published; each worker loads them between two of its chunks. Workers
then generate on different versions at the same time and the trainer never waits for a
chunk in production (``dora/generator_versions``: the versions the workers hold when a
step's batch is taken). Drawing prompts and scoring stay one chunk at a time.

A checkpoint (written between two chunks) keeps every chunk produced and not yet trained
on; a resumed run trains on them first, as the uninterrupted run would have, instead of
generating them again on newer weights."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from typing import Any

from rlpost.core.contract import Declares, Property
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.rollout.collected import Collected, CollectedBuffer
from rlpost.llm.rollout.sources.base import SCHEDULE, register_source
from rlpost.llm.rollout.sources.groups import (
    GroupsSource,
    Round,
    add_score_metrics,
    assemble,
    generate,
)
from rlpost.llm.rollout.sources.sync import SNAPSHOT_ENGINE, Timed
from rlpost.llm.rollout.stream import ChunkStream


@register_source
class DoraSource(Timed):
    """Chunks streamed from a generator thread, one weights version each."""

    name = "dora"
    layer = SCHEDULE
    overlapped = True
    label = "train.pipeline dora"
    example = ("train.pipeline=dora",)
    declares = Declares(
        requires={
            Property.GROUPS_ON_DEMAND: "streams chunks of plain groups",
            Property.TORCH_ENGINE: SNAPSHOT_ENGINE,
            Property.UNSHARDED: "copies the whole weights to its generator",
        },
        breaks={Property.SAME_THREAD: "streams rollouts beside training"},
    )
    state_key = "stream"

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.stream: ChunkStream | None = None
        self._restored: list[Collected] = []  # a checkpoint's chunks, handed out first
        self._draw = threading.Lock()  # several generators: prompts and scoring, one at a time
        self.views: list[Any] = []  # several generators: one engine view per Ray worker

    def _generators(self, chunk: int) -> list[Any]:
        """The producers: the inner source's ``collect`` on one thread, or one
        :meth:`_chunk_on` per Ray rollout worker."""
        t = self.trainer
        workers = getattr(t.engine, "workers", None)
        if t.cfg.rollout.workers < 2 or workers is None:
            return [lambda: self.inner.collect(chunk)]
        if not isinstance(self.inner, GroupsSource):
            raise ValueError(
                f"train.pipeline dora on {t.cfg.rollout.workers} rollout workers streams plain "
                f"groups; {self.inner.label} does not run there (use rollout.workers=1)"
            )
        t.engine.lazy = True
        self.views = [t.engine.view(i) for i in range(len(workers))]
        return [functools.partial(self._chunk_on, v, chunk) for v in self.views]

    def _chunk_on(self, view: Any, chunk: int) -> Collected:
        """``chunk`` groups generated on one worker, at the version it holds (it first
        loads the newest published weights if it holds older ones)."""
        t = self.trainer
        with self._draw:
            t.prompts.set_step(t.step)
            examples = t.prompts.next_batch(chunk)
        t0 = time.perf_counter()
        prompts = [encode_prompt(t.tok, e.prompt) for e in examples]
        batch = generate(t, prompts, t.preset.group_size, engine=view)
        with self._draw:
            res = t.scorer.score(batch, examples)
        metrics: dict[str, float] = {}
        add_score_metrics(metrics, res.metrics)
        metrics["time/rollout"] = time.perf_counter() - t0
        return assemble(t, [Round(batch, examples, res.rewards, res.components)], chunk, metrics)

    def next(self) -> Collected:
        t = self.trainer
        tc, want = t.cfg.train, t.cfg.rollout.prompts_per_step
        if self.stream is None:
            chunk = tc.stream_prompts or max(1, want // 4)
            producers = self._generators(chunk)
            self.stream = ChunkStream(
                producers,
                Collected.n_groups,
                lambda c: c.batch.policy_version,
                Collected.split,
                # + the one in each producer's hand: about a step ahead
                capacity=max(1, math.ceil(want / chunk) - len(producers)),
                start=self._restored,
            )
            self._restored = []
        parts, dropped = self.stream.take(want, t.version, tc.max_staleness)
        col = Collected.concat(parts)
        v = col.batch.row_versions
        col.metrics["dora/dropped_groups"] = float(dropped)
        col.metrics["dora/versions"] = float(len(v.unique()))
        col.metrics["dora/staleness_mean"] = float((t.version - v).float().mean())
        if self.views:
            col.metrics["dora/generator_versions"] = float(
                len({w.policy_version for w in self.views})
            )
        return col

    def paused(self) -> contextlib.AbstractContextManager:
        """Weight loads wait for the chunk in production to finish."""
        return self.stream.exclusive() if self.stream is not None else contextlib.nullcontext()

    def syncing(self) -> contextlib.AbstractContextManager:
        """Several generators take new weights on their own, between their chunks: the
        trainer only publishes them. One generator: :meth:`paused`."""
        return contextlib.nullcontext() if self.views else self.paused()

    def state_dict(self) -> tuple[Any, dict]:
        """The chunks produced and not yet trained on (the trainer saves inside
        :meth:`paused`, so none is being produced and the data position and random state
        it saves are those right after the last of them)."""
        buffer = CollectedBuffer("stream")
        buffer.items = self.stream.snapshot() if self.stream is not None else self._restored
        tensors, metas = buffer.state()
        return metas, tensors

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        buffer = CollectedBuffer("stream")
        buffer.load(tensors, state)
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self._restored = buffer.items

    def busy_spans(self) -> list[tuple[float, float]]:
        return self.stream.busy if self.stream is not None else []

    def forget_spans(self, before: float) -> None:
        """(The stream's own list is only appended to.)"""

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        super().close()
