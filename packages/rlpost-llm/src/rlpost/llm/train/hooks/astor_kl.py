"""ASTOR's per-task KL coefficients (001-18): each row's KL term in the loss scaled by its
task's multiplier, which the ``astor`` rollout source keeps from the tasks' utilities
(:func:`rlpost.core.multitask.kl_scales`; ``algo.astor.adaptive_kl``)."""

from __future__ import annotations

from typing import Any

from rlpost.llm.rollout.sources.astor import AstorSource
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook
from rlpost.llm.train.inputs import Role


@STEP_HOOKS.register
class AstorKLHook(StepHook):
    name = "astor_kl"
    label = "ASTOR's per-task KL"
    example = (
        "algo.astor={}",
        "algo.kl_coef=0.01",
        "data.mixture=[{task: arithmetic}, {task: countdown}]",
    )

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        value = cfg.algo.astor
        if value in (None, False):
            return False
        return not isinstance(value, dict) or value.get("adaptive_kl", True) is not False

    def provide(self, step: Any) -> None:
        src = next(s for s in self.trainer.rollouts.chain() if isinstance(s, AstorSource))
        step[Role.KL_SCALE] = src.row_scales(step.col.examples)
