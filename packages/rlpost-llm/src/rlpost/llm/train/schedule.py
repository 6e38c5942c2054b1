"""Training schedules a method can prescribe, and what they need to resume exactly.

* :class:`CurriculumSource`: a sequence of tasks trained one after the other
  (``data.curriculum``; continual post-training, CPO's setting). Examples carry their
  stage in ``meta["stage"]`` and :class:`StagedScore` scores each with its own task.
* :class:`StageBuffer`: Mu-GRPO's large generation-optimisation stages (000-17): the
  rollouts of a whole stage, generated with the stage's starting policy, consumed one step
  at a time; checkpointed with the run so a resume mid-stage continues exactly.
* :class:`ValidationAnchor`: REVA-PO's VAPR (004-09): the best validation checkpoint so
  far, written atomically beside the run; the trainer resets the policy and the
  reference to it whenever the current evaluation is worse.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor

from rlpost.llm.config import TaskStage
from rlpost.llm.data.prompts import PromptSource
from rlpost.llm.data.tasks import Example, Task, make_task
from rlpost.llm.rollout.engines.base import RolloutBatch

# ------------------------------------------------------------------------ curriculum


@dataclass(frozen=True)
class StagedScore:
    """The verifier of a curriculum: ``tasks[example.meta["stage"]].score`` (picklable)."""

    tasks: tuple[Task, ...]

    def __call__(self, completion: str, example: Example) -> float:
        return self.tasks[int(example.meta["stage"])].score(completion, example)


class CurriculumSource:
    """Prompt streams of a sequence of tasks; :meth:`set_step` selects the current one."""

    def __init__(self, stages: list[TaskStage], eval_size: int, seed: int):
        self.stages = stages
        self.tasks = tuple(make_task(s.task, **s.task_params) for s in stages)
        self.sources = []
        for i, task in enumerate(self.tasks):
            held = [_tag(e, i) for e in task.sample(eval_size, random.Random(10_000 + seed + i))]
            self.sources.append(PromptSource(None, task, held, seed + 7919 * i))
        self.ends = [sum(s.steps for s in stages[: i + 1]) for i in range(len(stages))]
        self.stage = 0

    @property
    def task(self) -> Task:
        return self.tasks[self.stage]

    @property
    def eval_examples(self) -> list[Example]:
        return self.sources[self.stage].eval_examples

    def names(self) -> list[str]:
        return [f"{i}-{s.task}" for i, s in enumerate(self.stages)]

    def stage_at(self, step: int) -> int:
        return next((i for i, end in enumerate(self.ends) if step < end), len(self.ends) - 1)

    def events(self, step: int) -> list[str]:
        """Task-boundary events before step ``step``'s update: ``["begin"]`` at the first
        step, ``["end", "begin"]`` at each later stage's first step (the previous task
        ended with the previous step), else none."""
        starts = [0, *self.ends[:-1]]
        if step == 0:
            return ["begin"]
        return ["end", "begin"] if step in starts else []

    def set_step(self, step: int) -> None:
        self.stage = self.stage_at(step)

    def next_batch(self, n: int) -> list[Example]:
        return [_tag(e, self.stage) for e in self.sources[self.stage].next_batch(n)]

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "sources": [s.state_dict() for s in self.sources]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.stage = sd["stage"]
        for s, st in zip(self.sources, sd["sources"], strict=True):
            s.load_state_dict(st)


def _tag(e: Example, stage: int) -> Example:
    return Example(e.prompt, e.answer, {**e.meta, "stage": stage})


# ------------------------------------------------------------------- staged rollouts


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


# ------------------------------------------------------------------------------ VAPR


class ValidationAnchor:
    """The best validation checkpoint so far (``<run>/vapr-best.safetensors``)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "vapr-best.safetensors"
        self.best: float | None = None
        self.resets = 0

    def update(self, model: torch.nn.Module, accuracy: float) -> bool:
        """Record ``model`` as the anchor when ``accuracy`` is the best so far; returns
        ``True`` when it is worse than the anchor (the trainer then resets to it)."""
        if self.best is None or accuracy >= self.best:
            tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
            save_model(model, str(tmp))
            os.replace(tmp, self.path)
            self.best = accuracy
            return False
        return True

    def restore(self, *modules: torch.nn.Module) -> None:
        """Load the anchor's weights into each module (policy, reference)."""
        for m in modules:
            load_model(m, str(self.path), strict=True)
        self.resets += 1

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "resets": self.resets}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.best, self.resets = sd["best"], sd["resets"]
