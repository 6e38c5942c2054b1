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

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.presets import Choice
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.sources.base import SCHEDULE, RolloutSource, register_source


def batch_to_state(b: RolloutBatch, prefix: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A :class:`RolloutBatch` as safetensors-able tensors and JSON."""
    flat = [t for p in b.prompt_ids for t in p]
    lens = [len(p) for p in b.prompt_ids]
    tensors = {
        f"{prefix}.prompt_flat": torch.tensor(flat, dtype=torch.long),
        f"{prefix}.prompt_lens": torch.tensor(lens, dtype=torch.long),
        f"{prefix}.completion_ids": b.completion_ids,
        f"{prefix}.logprobs": b.logprobs,
        f"{prefix}.mask": b.mask,
        f"{prefix}.group": b.group,
    }
    meta = {
        "finish_reasons": list(b.finish_reasons),
        "pad_id": b.pad_id,
        "policy_version": b.policy_version,
    }
    return tensors, meta


def batch_from_state(t: dict[str, Tensor], meta: dict[str, Any], prefix: str) -> RolloutBatch:
    flat, lens = t[f"{prefix}.prompt_flat"].tolist(), t[f"{prefix}.prompt_lens"].tolist()
    prompts, i = [], 0
    for n in lens:
        prompts.append(flat[i : i + n])
        i += n
    return RolloutBatch(
        prompts,
        t[f"{prefix}.completion_ids"],
        t[f"{prefix}.logprobs"],
        t[f"{prefix}.mask"],
        list(meta["finish_reasons"]),
        t[f"{prefix}.group"],
        int(meta["pad_id"]),
        int(meta["policy_version"]),
    )


class StageBuffer:
    """The remaining rollouts of the current Mu-GRPO stage (oldest first).

    ``items`` are the trainer's collected batches (objects with ``batch``, ``examples``,
    ``rewards``, ``components``, ``accuracy``, ``old_logp``, ``metrics``); the trainer
    fills it at a stage's first step and pops one per step.
    """

    def __init__(self) -> None:
        self.items: list[Any] = []

    def __len__(self) -> int:
        return len(self.items)

    def state(self) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
        tensors: dict[str, Tensor] = {}
        metas = []
        for i, c in enumerate(self.items):
            t, m = batch_to_state(c.batch, f"stage{i}")
            tensors.update(t)
            tensors[f"stage{i}.rewards"] = c.rewards
            tensors[f"stage{i}.components"] = c.components
            tensors[f"stage{i}.accuracy"] = c.accuracy
            if c.old_logp is not None:
                tensors[f"stage{i}.old_logp"] = c.old_logp
            m["examples"] = [[e.prompt, e.answer, e.meta] for e in c.examples]
            m["metrics"] = c.metrics
            metas.append(m)
        return tensors, metas

    def load(self, tensors: dict[str, Tensor], metas: list[dict[str, Any]], make) -> None:
        """Rebuild the items with ``make(batch, examples, rewards, components, accuracy,
        metrics, old_logp)`` (the trainer's collected-batch constructor)."""
        self.items = []
        for i, m in enumerate(metas):
            p = f"stage{i}"
            self.items.append(
                make(
                    batch_from_state(tensors, m, p),
                    [Example(a, b, c) for a, b, c in m["examples"]],
                    tensors[f"{p}.rewards"],
                    tensors[f"{p}.components"],
                    tensors[f"{p}.accuracy"],
                    dict(m["metrics"]),
                    tensors.get(f"{p}.old_logp"),
                )
            )


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
        self.buffer = StageBuffer()

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
        st = {k: v for k, v in tensors.items() if k.startswith("stage")}
        self.buffer.load(st, state, _collected)


def _collected(batch, examples, rewards, components, accuracy, metrics, old_logp) -> Collected:
    return Collected(batch, examples, rewards, components, accuracy, metrics, old_logp)
