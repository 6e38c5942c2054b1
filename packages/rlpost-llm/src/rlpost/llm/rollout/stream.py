"""DORA's multi-version streaming rollout (001-29): one generator thread, or one per Ray
rollout worker.

A producer thread generates *chunks* (a few complete groups) without pause, each chunk
wholly under one weights version: it holds its lock (:attr:`ChunkStream.locks`) while it
generates, and the trainer loads new weights only under that lock
(:meth:`ChunkStream.exclusive`),
so versions change between chunks and never inside a trajectory. The trainer takes the
next chunks in arrival order (:meth:`ChunkStream.take`) until it has a step's groups; a
chunk more than ``max_stale`` versions older than the trainer is dropped, so the staleness
bound holds by construction, and one step's batch may mix versions (rows of the
versions in flight when it was assembled). The queue holds at most ``capacity`` chunks:
the producer runs ahead of the trainer by about one step and no further.

Several producers (DORA's several rollout instances, one per Ray rollout worker): one
thread and one lock each, all feeding the one queue. Each producer's chunk is wholly
one version, while different producers may be generating on different versions at the
same time; :meth:`ChunkStream.exclusive` waits for every producer to finish its chunk.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence


class ChunkStream[T]:
    """``produce()`` called back to back on a daemon thread, its results queued FIFO;
    given a list of producers, one thread each, all into the one queue.

    ``size(chunk)``: the chunk's groups; ``version(chunk)``: the weights version that
    generated it; ``split(chunk, k)``: its first ``k`` groups and the rest."""

    def __init__(
        self,
        produce: Callable[[], T] | Sequence[Callable[[], T]],
        size: Callable[[T], int],
        version: Callable[[T], int],
        split: Callable[[T, int], tuple[T, T]],
        capacity: int,
        start: list[T] | None = None,
    ):
        producers = list(produce) if isinstance(produce, Sequence) else [produce]
        self.size, self.version, self.split = size, version, split
        # one lock per producer, held while it produces or queues a chunk
        self.locks = [threading.Lock() for _ in producers]
        self._queue: queue.Queue[T] = queue.Queue(maxsize=max(1, capacity))
        # the surplus groups of a chunk split across steps (first: a restored snapshot's)
        self._carry: list[T] = list(start or [])
        self._hands: list[T | None] = [None] * len(producers)  # produced, waiting for room
        self._yield = threading.Event()  # the trainer waits for the locks
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.busy: list[tuple[float, float]] = []  # (start, end) of each chunk's production
        self._threads = [
            threading.Thread(target=self._run, args=(i, f), name=f"dora-stream-{i}", daemon=True)
            for i, f in enumerate(producers)
        ]
        for t in self._threads:
            t.start()

    def _run(self, i: int, produce: Callable[[], T]) -> None:
        lock = self.locks[i]
        try:
            while not self._stop.is_set():
                while self._yield.is_set() and not self._stop.is_set():
                    time.sleep(0.0005)  # let the trainer load weights before the next chunk
                with lock:
                    if self._stop.is_set():
                        return
                    t0 = time.perf_counter()
                    self._hands[i] = produce()
                    self.busy.append((t0, time.perf_counter()))
                while not self._stop.is_set() and not self._queued(i):
                    time.sleep(0.005)  # the lock is free meanwhile (weight loads, snapshots)
        except BaseException as exc:  # re-raised in the trainer's thread by take()
            self._error = exc

    def _queued(self, i: int) -> bool:
        """Move producer ``i``'s chunk in hand into the queue if there is room (under its
        lock, so a :meth:`snapshot` sees it in exactly one of the two places)."""
        with self.locks[i]:
            try:
                self._queue.put_nowait(self._hands[i])
            except queue.Full:
                return False
            self._hands[i] = None
            return True

    def snapshot(self) -> list[T]:
        """Every chunk produced and not yet taken, in arrival order; called inside
        :meth:`exclusive` (nothing is being produced or queued meanwhile). A stream built
        with ``start=`` this list hands them out first, as this one would have."""
        if not all(lock.locked() for lock in self.locks):
            raise RuntimeError("ChunkStream.snapshot() outside exclusive()")
        with self._queue.mutex:
            queued = list(self._queue.queue)
        return [*self._carry, *queued, *(h for h in self._hands if h is not None)]

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """No chunk is being produced inside this block (weight loads, evaluation): every
        producer has finished the chunk it was producing."""
        self._yield.set()
        try:
            with contextlib.ExitStack() as held:
                for lock in self.locks:
                    held.enter_context(lock)
                yield
        finally:
            self._yield.clear()

    def _next(self) -> T:
        if self._carry:
            return self._carry.pop(0)
        while True:
            try:
                return self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._error is not None:
                    raise self._error from None
                if not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("the rollout stream stopped") from None

    def take(self, want: int, version: int, max_stale: int) -> tuple[list[T], int]:
        """The next chunks, in arrival order, holding exactly ``want`` groups no more than
        ``max_stale`` versions behind ``version`` (a chunk's surplus waits for the next
        step); returns them and how many groups were dropped as too stale."""
        parts: list[T] = []
        have = dropped = 0
        while have < want:
            chunk = self._next()
            n = self.size(chunk)
            if version - self.version(chunk) > max_stale:
                dropped += n
                continue
            if have + n > want:
                chunk, rest = self.split(chunk, want - have)
                self._carry.insert(0, rest)
                n = want - have
            parts.append(chunk)
            have += n
        return parts, dropped

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        for t in self._threads:
            t.join(timeout=60)
