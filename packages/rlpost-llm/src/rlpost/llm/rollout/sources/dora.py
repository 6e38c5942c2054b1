"""DORA's multi-version streaming (001-29): a generator thread streams chunks of
``train.stream_prompts`` groups without pause, each chunk wholly from one weights version
(new weights load between chunks, :class:`~rlpost.llm.rollout.stream.ChunkStream`); a
step trains on the next ``prompts_per_step`` groups in arrival order, so its rows may come
from several versions, and groups more than ``train.max_staleness`` versions old are
dropped (``dora/dropped_groups``).

A checkpoint (written between two chunks) keeps every chunk produced and not yet trained
on; a resumed run trains on them first, as the uninterrupted run would have, instead of
generating them again on newer weights."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from rlpost.core.contract import Declares, Property
from rlpost.llm.rollout.collected import Collected, CollectedBuffer
from rlpost.llm.rollout.sources.base import SCHEDULE, register_source
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

    def next(self) -> Collected:
        t = self.trainer
        tc, want = t.cfg.train, t.cfg.rollout.prompts_per_step
        if self.stream is None:
            chunk = tc.stream_prompts or max(1, want // 4)
            self.stream = ChunkStream(
                lambda: self.inner.collect(chunk),
                Collected.n_groups,
                lambda c: c.batch.policy_version,
                Collected.split,
                capacity=max(1, math.ceil(want / chunk) - 1),  # + the one in hand: a step ahead
                start=self._restored,
            )
            self._restored = []
        parts, dropped = self.stream.take(want, t.version, tc.max_staleness)
        col = Collected.concat(parts)
        v = col.batch.row_versions
        col.metrics["dora/dropped_groups"] = float(dropped)
        col.metrics["dora/versions"] = float(len(v.unique()))
        col.metrics["dora/staleness_mean"] = float((t.version - v).float().mean())
        return col

    def paused(self) -> contextlib.AbstractContextManager:
        """Weight loads wait for the chunk in production to finish."""
        return self.stream.exclusive() if self.stream is not None else contextlib.nullcontext()

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
