"""RolloutPipe (004-30): one step whose rollouts are generated in chunks of
``train.stream_prompts`` complete groups on a generator thread, at the step's fixed
weights, while the trainer back-propagates each chunk as soon as it arrives.

Complete-group pipelining: a chunk holds every sample of each of its groups (trainable
ones only, under dynamic sampling), so it goes to the trainer FIFO the moment it is
scored. Frontier-group dispatch: the generator admits the requests of the groups the
batch still needs, in order, and no others, so ready groups arrive early and steadily. The
loss normaliser counts the whole batch's tokens, unknown until its last group: chunks are
back-propagated with unit counts and the summed gradient is rescaled once at the end
(:func:`rlpost.core.aggregation.count_scale`), so the update equals the synchronous one on
the same groups.
"""

from __future__ import annotations

import queue
import time
from typing import Any

import torch

from rlpost.core.aggregation import count_scale
from rlpost.core.contract import Declares, Property
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.sources.base import SCHEDULE, Rollouts, register_source
from rlpost.llm.rollout.sources.sync import SNAPSHOT_ENGINE, Threaded


@register_source
class RolloutPipeSource(Threaded):
    """Generation and the update interleaved, chunk by chunk, within one step."""

    name = "rolloutpipe"
    layer = SCHEDULE
    overlapped = True
    trains = True
    label = "train.pipeline rolloutpipe"
    thread = "rolloutpipe"
    example = ("train.pipeline=rolloutpipe",)
    declares = Declares(
        requires={
            Property.GROUPS_ON_DEMAND: "generates the step in chunks of plain groups",
            Property.TORCH_ENGINE: SNAPSHOT_ENGINE,
            Property.UNSHARDED: "copies the whole weights to its generator",
            Property.ONE_PROCESS: "back-propagates chunks as one process generates them",
        },
        breaks={
            Property.SAME_THREAD: "generates on a thread beside training",
            Property.WHOLE_BATCH: "trains each complete group as it arrives",
        },
    )

    def _produce(self, chunks: queue.Queue, want: int, size: int) -> None:
        """The frontier groups first: the next ones the batch needs."""
        have = 0
        try:
            while have < want:
                ask = min(size, want - have)
                t0 = time.perf_counter()
                part = self.inner.collect(ask)
                self.spans.append((t0, time.perf_counter()))
                chunks.put(part)
                have += part.n_groups()
                if part.n_groups() < ask:  # dynamic sampling ran out of refill rounds
                    break
        except BaseException as exc:  # re-raised on the trainer's thread
            chunks.put(exc)
        finally:
            chunks.put(None)

    def step(self, stop: int) -> Rollouts:
        """Returns the step's rollouts, the update's metrics and the seconds waited."""
        t = self.trainer
        want = t.cfg.rollout.prompts_per_step
        size = t.cfg.train.stream_prompts or max(1, want // 4)
        chunks: queue.Queue = queue.Queue()
        done = self.background(self._produce, chunks, want, size)
        t.model.train()
        t0 = time.perf_counter()
        acc, steps, parts, waited, last = t.updater.accumulator(), [], [], 0.0, None
        while True:
            t_wait = time.perf_counter()
            part = chunks.get()
            waited += time.perf_counter() - t_wait
            if part is None:
                break
            if isinstance(part, BaseException):
                done.result()
                t.optimizer.zero_grad(set_to_none=True)
                raise part
            last = part
            if not len(part.batch):
                continue  # (every group of the chunk was degenerate)
            parts.append(part)
            step = t.step_inputs(part)
            steps.append(step)
            if not acc.bad:
                rows = step.trained_rows()
                t.updater.backward(step, rows, 0, (1.0, 1.0), acc, False)
        done.result()
        t.confirm_update()  # the last update generated finite logits: it was good
        if not parts:  # no trainable group: nothing to update
            t.optimizer.zero_grad(set_to_none=True)
            return Rollouts(last, waited, {})
        return Rollouts(Collected.concat(parts), waited, self._apply(steps, acc, t0))

    def _apply(self, steps: list, acc: Any, t0: float) -> dict[str, float]:
        """Rescale the summed gradient by the whole step's counts, then step."""
        t = self.trainer
        tokens = sum(s.counts()[0] for s in steps)
        seqs = sum(s.counts()[1] for s in steps)
        budget = float(t.cfg.rollout.max_new_tokens)
        scale = count_scale(t.recipe.aggregation, tokens, seqs, budget)
        with torch.no_grad():
            for q in t.model.parameters():
                if q.grad is not None:
                    q.grad.mul_(scale)
        t.updater.optimizer_step(acc, 0)
        t.updater.close(acc, False)
        metrics = t.updater.metrics(steps, acc, False, t0)
        metrics["pipe/chunks"] = float(len(steps))
        return metrics
