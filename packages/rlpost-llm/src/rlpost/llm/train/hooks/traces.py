"""``run.traces``: each update's rows appended to the run's rollout traces
(:mod:`rlpost.llm.tools.traces`), on the main rank."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook
from rlpost.llm.train.inputs import Role


@STEP_HOOKS.register
class TracesHook(StepHook):
    name = "traces"
    label = "run.traces"
    order = 90  # after everything that changes the step
    example = ("run.traces=true",)

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return bool(getattr(cfg.run, "traces", False))

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        from rlpost.llm.tools.traces import TraceWriter

        self.writer = TraceWriter(trainer.run_dir) if trainer.main else None

    @torch.no_grad()
    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        if self.writer is None:
            return
        col, t = step.col, self.trainer
        b = col.batch
        mask = b.mask.float()
        adv = step[Role.ADVANTAGES].float()
        if adv.dim() == 2:  # per token: the row's mean over its completion tokens
            adv = (adv * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        texts, versions = b.texts(t.tok), b.row_versions.tolist()
        rows = []
        for i, g in enumerate(b.group.tolist()):
            ex = col.examples[i]
            rows.append({
                "row": i, "group": g, "prompt": ex.prompt, "answer": ex.answer,
                "completion": texts[i], "reward": float(col.rewards[i]),
                "components": dict(zip(t.scorer.names, col.components[i].tolist(), strict=False)),
                "correct": bool(col.accuracy[i] >= 1.0), "advantage": float(adv[i]),
                "version": int(versions[i]), "finish": b.finish_reasons[i],
                "length": int(mask[i].sum()),
            })  # fmt: skip
        self.writer.write(t.step + 1, rows)
