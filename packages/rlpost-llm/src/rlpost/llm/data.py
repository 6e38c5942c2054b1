"""Prompt sources: an endless stream of training examples with a resumable position.

* task-backed: examples drawn from a synthetic task with a seeded ``random.Random``
  (state saved in checkpoints), a held-out set from a different seed;
* file-backed: a local JSONL / parquet with "prompt" and "answer" columns loaded with
  ``datasets``; the last ``eval_size`` rows are held out, the rest are visited in a
  fresh seeded permutation each epoch.
"""

from __future__ import annotations

import random
from typing import Any

from rlpost.llm.tasks import Example, Task, make_task


class PromptSource:
    def __init__(
        self,
        examples: list[Example] | None,
        task: Task | None,
        eval_examples: list[Example],
        seed: int,
    ):
        self.task = task
        self.examples = examples
        self.eval_examples = eval_examples
        self.seed = seed
        self.rng = random.Random(seed)
        self.epoch, self.pos = 0, 0
        self._order: list[int] = []
        if examples is not None:
            if not examples:
                raise ValueError("the training data is empty after holding out the eval rows")
            self._shuffle()

    def _shuffle(self) -> None:
        assert self.examples is not None
        self._order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(self._order)

    def next_batch(self, n: int) -> list[Example]:
        if self.examples is None:
            assert self.task is not None
            return self.task.sample(n, self.rng)
        out = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._shuffle()
            out.append(self.examples[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        state = self.rng.getstate()
        return {"rng": [state[0], list(state[1]), state[2]], "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rng.setstate((sd["rng"][0], tuple(sd["rng"][1]), sd["rng"][2]))
        self.epoch, self.pos = sd["epoch"], sd["pos"]
        if self.examples is not None:
            self._shuffle()


def _load_file(path: str) -> list[Example]:
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    ds = datasets.load_dataset(kind, data_files=path, split="train")
    missing = {"prompt", "answer"} - set(ds.column_names)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}; found {ds.column_names}")
    return [
        Example(
            str(r["prompt"]),
            str(r["answer"]),
            {k: v for k, v in r.items() if k not in ("prompt", "answer")},
        )
        for r in ds
    ]


def make_prompt_source(
    task_name: str, task_params: dict, path: str | None, eval_size: int, seed: int
) -> PromptSource:
    """Build the training stream and held-out set described by a ``DataConfig``."""
    if path is None:
        task = make_task(task_name, **task_params)
        held_out = task.sample(eval_size, random.Random(10_000 + seed))
        return PromptSource(None, task, held_out, seed)
    rows = _load_file(path)
    if len(rows) <= eval_size:
        raise ValueError(f"{path}: {len(rows)} rows, need more than data.eval_size={eval_size}")
    return PromptSource(rows[:-eval_size], None, rows[-eval_size:], seed)
