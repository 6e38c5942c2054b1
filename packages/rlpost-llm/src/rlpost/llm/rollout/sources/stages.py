"""Mu-GRPO's few large generation-optimisation stages (000-17).

At a stage's first step the stage's starting policy generates the rollouts of all of the
stage's ``ceil(steps / stages)`` steps (and its own log-probs of them, the behaviour
policy of every later step of the stage); the steps then optimise on them in turn. The
stage's remaining rollouts are checkpointed with the run, so a resume mid-stage continues
exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.presets import Choice
from rlpost.llm.rollout.collected import Collected, CollectedBuffer
from rlpost.llm.rollout.sources.base import SCHEDULE, RolloutSource, register_source


@dataclass(frozen=True)
class StagesParams:
    stages: int = 4

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"stages must be >= 1, got {self.stages}")


@register_source
class StagesSource(RolloutSource):
    """A stage's rollouts generated at its first step, consumed one step at a time."""

    name = "stages"
    layer = SCHEDULE
    params = StagesParams
    option = "stages"
    example = ("algo.stages=2",)
    label = "Mu-GRPO stages (algo.stages > 1)"
    state_key = "stage_buffer"
    declares = Declares(
        requires={
            Property.SAME_THREAD: "need synchronous rollouts (train.pipeline sync)",
            Property.UNSHARDED: "are not wired to sharded weights yet",
        },
        breaks={Property.PER_STEP: "generate a whole stage's rollouts at its first step"},
    )

    @classmethod
    def from_option(cls, value: int, current: Choice | None) -> Choice | None:
        return Choice(cls.name, {"stages": int(value)}) if int(value) > 1 else None

    def __init__(self, trainer: Any, inner: Any, params: StagesParams):
        super().__init__(trainer, inner, params)
        self.stage_len = math.ceil(trainer.total_steps / params.stages)
        self.buffer = CollectedBuffer("stage")

    def next(self) -> Collected:
        t = self.trainer
        if not len(self.buffer):
            n = min(self.stage_len, t.total_steps - t.step)
            fill = []
            for _ in range(n):
                col = self.inner.collect()
                col.old_logp = t.forwards.nograd(t.model, col.batch).logp
                fill.append(col)
            self.buffer.items = fill
        return self.buffer.items.pop(0)

    def max_staleness(self, bound: int) -> int:
        return max(bound, self.stage_len - 1)

    def state_dict(self) -> tuple[Any, dict[str, Tensor]]:
        tensors, metas = self.buffer.state()
        return metas, tensors

    def load_state_dict(self, state: Any, tensors: dict[str, Tensor]) -> None:
        self.buffer.load(tensors, state)
