"""Held-out accuracy on tasks the run never trains on (``data.transfer``): at every
evaluation, each transfer task's held-out set (``data.eval_size`` examples drawn with
their own seed) answered greedily and verified by that task's own verifier, logged as
``eval/transfer/<task>/accuracy``. GRLO (000-20) measures with it what conversational
RLHF teaches the reasoning tasks."""

from __future__ import annotations

import random
from typing import Any

from rlpost.llm.data.tasks import make_task
from rlpost.llm.rollout.sources.base import greedy_accuracy
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


@STEP_HOOKS.register
class TransferHook(StepHook):
    name = "transfer_eval"
    label = "data.transfer"
    example = ("data.transfer=[{task: countdown}]",)

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return bool(getattr(cfg.data, "transfer", None))

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        d = trainer.cfg.data
        self.sets = []
        for i, tt in enumerate(d.transfer):
            task = make_task(tt.task, **tt.task_params)
            held = task.sample(d.eval_size, random.Random(30_000 + d.seed * 101 + i))
            self.sets.append((tt.task, task, held))

    def evaluated(self, metrics: dict[str, float]) -> None:
        for name, task, held in self.sets:
            metrics[f"eval/transfer/{name}/accuracy"] = greedy_accuracy(self.trainer, held, task)
