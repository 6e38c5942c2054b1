"""The two plain schedules: ``sync`` (generate, then train) and ``one_step_off`` (step
t+1's rollouts generated on a weight snapshot in a background thread while step t
trains; every batch carries the policy version that generated it and the staleness bound
is enforced)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from rlpost.core.contract import Declares, Property
from rlpost.llm.rollout.collected import CollectedBuffer
from rlpost.llm.rollout.sources.base import SCHEDULE, RolloutSource, register_source

#: what ``train.overlapped`` sources require of the engine: their own weight snapshot
SNAPSHOT_ENGINE = "generates on a weight snapshot beside training (lean or hf engine only)"


class Timed(RolloutSource):
    """A schedule that records when its generator was busy (``time/generator_idle``)."""

    overlapped: ClassVar[bool] = False  # generation runs beside training, on a snapshot

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.spans: list[tuple[float, float]] = []

    def timed_next(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.next()
        finally:
            self.spans.append((t0, time.perf_counter()))

    def busy_spans(self) -> list[tuple[float, float]]:
        return self.spans

    def forget_spans(self, before: float) -> None:
        """Drop the spans that ended before ``before`` (already counted)."""
        self.spans = [(a, b) for a, b in self.spans if b > before]


class Threaded(Timed):
    """A schedule that generates on one background thread of its own."""

    thread: ClassVar[str] = "rollout"  # the thread's name

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self._executor: ThreadPoolExecutor | None = None

    def background(self, fn, *args: Any) -> Future:
        """``fn(*args)`` on the schedule's thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread)
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        super().close()


@register_source
class SyncSource(Timed):
    """Generate, then train, on one thread."""

    name = "sync"
    layer = SCHEDULE
    label = "train.pipeline sync"

    def next(self) -> Any:
        return self.timed_next()


@register_source
class OneStepOffSource(Threaded):
    """Step t+1's rollouts generated while step t trains (``train.async_rollouts``)."""

    name = "one_step_off"
    layer = SCHEDULE
    overlapped = True
    label = "train.pipeline one_step_off"
    example = ("train.pipeline=one_step_off",)
    declares = Declares(
        requires={
            Property.TORCH_ENGINE: SNAPSHOT_ENGINE,
            Property.UNSHARDED: "copies the whole weights to its snapshot",
        },
        breaks={Property.SAME_THREAD: "generates the next step's rollouts beside training"},
    )

    state_key = "ahead"

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self._pending: Future | None = None

    def _submit(self) -> None:
        self._pending = self.background(self.timed_next)

    def next(self) -> Any:
        if self._pending is None:
            self._submit()
        pending, self._pending = self._pending, None
        return pending.result()

    def start_next(self, stop: int) -> None:
        t = self.trainer
        if t.dist.main and t.step + 1 < stop:  # generated while this step's update runs
            self._submit()

    def finish(self) -> float:
        """The engine's weights must not change mid-generation: wait for it."""
        if self._pending is None:
            return 0.0
        t0 = time.perf_counter()
        self._pending.result()
        return time.perf_counter() - t0

    def reset(self) -> None:
        self._pending = None

    def state_dict(self) -> tuple[Any, dict]:
        """The batch generated ahead for the next step (on the weights before this step's
        update, with the prompts and random draws it already took): a resumed run trains
        on it, as the uninterrupted run would, instead of generating it again on newer
        weights."""
        buffer = CollectedBuffer("ahead")
        if self._pending is not None:
            buffer.items = [self._pending.result()]
        tensors, metas = buffer.state()
        return metas, tensors

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        buffer = CollectedBuffer("ahead")
        buffer.load(tensors, state)
        self._pending = None
        if buffer.items:
            done: Future = Future()
            done.set_result(buffer.items[0])
            self._pending = done


#: the default ``train.pipeline``, and the one ``train.async_rollouts: true`` selects
SYNC_PIPELINE, ASYNC_PIPELINE = SyncSource.name, OneStepOffSource.name
