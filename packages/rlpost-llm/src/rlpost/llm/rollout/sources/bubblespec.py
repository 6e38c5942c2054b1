"""BubbleSpec (001-05): while step t trains, a weight snapshot generates rollouts of step
t+1's prompts; at step t+1 they serve as drafts that the updated policy verifies
(``train.draft_k`` tokens a forward), so the rollouts stay exactly on-policy and the
generator's idle window during the update is spent drafting."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from rlpost.core.contract import Declares, Property
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.sources.base import SCHEDULE, register_source
from rlpost.llm.rollout.sources.sync import SNAPSHOT_ENGINE, Threaded


@register_source
class BubbleSpecSource(Threaded):
    """This step's rollouts verify drafts a snapshot made during the last update."""

    name = "bubblespec"
    layer = SCHEDULE
    overlapped = True
    label = "train.pipeline bubblespec"
    thread = "drafts"
    example = ("train.pipeline=bubblespec",)
    declares = Declares(
        requires={
            Property.GROUPS_ON_DEMAND: "drafts plain single-turn groups",
            Property.ONE_ROUND: "drafts each prompt's group once",
            Property.SINGLE_TASK: "draws the next step's prompts ahead of it",
            Property.STOCK_ENGINE: "verifies its drafts with its own engine",
            Property.TORCH_ENGINE: SNAPSHOT_ENGINE,
            Property.UNSHARDED: "copies the whole weights to its drafter",
        },
        breaks={
            Property.SAME_THREAD: "drafts the next step's rollouts beside training",
            Property.STOCK_ENGINE: "replaces the engine with a draft verifier",
        },
    )

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self._pending: Future | None = None
        self.drafter = None

    def make_engine(self) -> Any:
        """The policy verifying drafts, and the drafter: an engine on its own snapshot."""
        from rlpost.llm.rollout.engines import make_local_engine
        from rlpost.llm.rollout.engines.speculative import SpeculativeEngine

        t = self.trainer
        self.drafter = make_local_engine(t.cfg.rollout.engine, t.model, t.tok, own_copy=True)
        return SpeculativeEngine(t.model, t.tok, None, k=t.cfg.train.draft_k)

    def next(self) -> Collected:
        t = self.trainer
        want, G = t.cfg.rollout.prompts_per_step, t.preset.group_size
        if self._pending is not None:
            examples, drafts = self._pending.result()
            self._pending = None
        else:  # the first step (or after a resume): nothing was pre-generated
            examples = t.prompts.next_batch(want)
            drafts = [[] for _ in range(want * G)]
        t0 = time.perf_counter()
        col = self.inner.collect(given=(examples, drafts))
        self.spans.append((t0, time.perf_counter()))
        if t.step + 1 < t.total_steps:
            nxt = t.prompts.next_batch(want)
            self.drafter.update_weights(t.model.state_dict(), t.version)
            self._pending = self.background(self.drafts_for, nxt)
        return col

    def drafts_for(self, examples: list[Example]) -> tuple[list[Example], list[list[int]]]:
        """The snapshot's rollouts of ``examples``, as drafts (token lists, one per row)."""
        t = self.trainer
        t0 = time.perf_counter()
        try:
            prompts = [encode_prompt(t.tok, e.prompt) for e in examples]
            b = self.drafter.generate(prompts, t.preset.group_size, t.sampling)
            lens = b.lengths.tolist()
            return examples, [b.completion_ids[i, : lens[i]].tolist() for i in range(len(b))]
        finally:
            self.spans.append((t0, time.perf_counter()))

    def reset(self) -> None:
        self._pending = None
