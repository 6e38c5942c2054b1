"""Prompt sources: an endless stream of training examples with a resumable position.

* task-backed: examples drawn from a synthetic task with a seeded ``random.Random``
  (state saved in checkpoints), a held-out set from a different seed;
* file-backed: a local JSONL / parquet (or a ``datasets.Dataset`` from Python) with a
  "prompt" column and, for the ``correct`` reward, an "answer" column; the last
  ``eval_size`` rows are held out (fewer when the data set is small), the rest are
  visited in a fresh seeded permutation each epoch;
* a mixture of task domains (:class:`MixtureSource`, ``data.mixture``), each prompt
  tagged with its domain and scored by the domain's verifier (:class:`DomainScore`);
* a curriculum (:class:`CurriculumSource`, ``data.curriculum``): tasks trained one after
  the other (continual post-training, CPO's setting), each example scored by its own
  task (:class:`StagedScore`).

Every source answers the same calls: ``next_batch(n)``, ``set_step(step)`` (the
curriculum's stage), ``verifier()`` (the ``correct`` reward), ``eval_examples`` and
``named_eval_sets()`` (held-out sets by name; ``mean_of_sets``: the overall accuracy is their
mean), ``state_dict`` / ``load_state_dict``. :func:`make_prompts` builds the one a
``DataConfig`` describes.

A prompt is plain text or, as in TRL's conversational data sets, a list of messages
(``{"role": ..., "content": ...}``); :func:`encode_prompt` renders messages with the
tokenizer's chat template and the generation prompt, and encodes text as it is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpost.llm.data.tasks import Example, Task, is_conversational, make_task, math_verify_reward

Prompt = str | list[dict[str, Any]]


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of ``prompt``: text as it is (no special tokens added); messages through
    the tokenizer's chat template with the generation prompt (then encoded without
    adding special tokens again, as TRL does)."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False).input_ids
    if not is_conversational(prompt):
        raise ValueError(
            f"a prompt must be text or a list of {{'role', 'content'}} messages, got {prompt!r:.80}"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the data has conversational prompts (lists of messages) but the model's "
            "tokenizer has no chat template: use plain-text prompts or a chat model"
        )
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


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

    mean_of_sets = False

    def set_step(self, step: int) -> None:
        """(One task throughout.)"""

    def verifier(self):
        """The task's own verifier, else math-verify against the "answer" column."""
        return self.task.score if self.task is not None else math_verify_reward

    def named_eval_sets(self) -> dict[str, list[Example]]:
        return {}

    def events(self, step: int) -> list[str]:
        """(No task boundaries.)"""
        return []

    def state_dict(self) -> dict[str, Any]:
        state = self.rng.getstate()
        return {"rng": [state[0], list(state[1]), state[2]], "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rng.setstate((sd["rng"][0], tuple(sd["rng"][1]), sd["rng"][2]))
        self.epoch, self.pos = sd["epoch"], sd["pos"]
        if self.examples is not None:
            self._shuffle()


def _rows_to_examples(rows: Any, where: str, need_answer: bool) -> list[Example]:
    columns = list(rows.column_names)
    if "prompt" not in columns:
        raise ValueError(f"{where}: no 'prompt' column; found {columns}")
    if need_answer and "answer" not in columns:
        raise ValueError(
            f"{where}: no 'answer' column, which the 'correct' reward needs; for a prompt-only "
            "data set give your own reward: reward.funcs=[{name: 'my_pkg.rewards:fn'}]"
        )
    out = []
    for i, r in enumerate(rows):
        prompt = r["prompt"]
        if not isinstance(prompt, str) and not is_conversational(prompt):
            raise ValueError(
                f"{where}: row {i}: 'prompt' must be text or a list of {{'role', 'content'}} "
                f"messages, got {type(prompt).__name__}"
            )
        if not (prompt.strip() if isinstance(prompt, str) else prompt):
            raise ValueError(f"{where}: row {i + 1}: the 'prompt' is empty")
        answer = r.get("answer")
        meta = {k: v for k, v in r.items() if k not in ("prompt", "answer")}
        out.append(Example(prompt, "" if answer is None else str(answer), meta))
    return out


def _load_file(path: str, need_answer: bool = True, max_row_mb: float = 64.0) -> list[Example]:
    """The rows of a JSONL / parquet file; a JSON Lines file is checked row by row first
    (bounded memory; each problem named with its line: :mod:`rlpost.core.io.rows`)."""
    from rlpost.core.io.config import ConfigError
    from rlpost.core.io.rows import check_json_lines, is_json_lines

    if not Path(path).is_file():
        raise ConfigError(f"data.path: no such file {path}")
    if is_json_lines(path):
        check_json_lines(path, max_row_mb=max_row_mb)
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a local file loads in moments: no bars to stderr
    try:
        ds = datasets.load_dataset(kind, data_files=path, split="train")
    except Exception as exc:  # a malformed parquet / JSON array file
        raise ConfigError(f"data.path: cannot read {path}: {exc}") from exc
    finally:
        if bars:
            datasets.enable_progress_bars()
    if len(ds) == 0:
        raise ConfigError(f"data.path: {path} holds no rows")
    return _rows_to_examples(ds, f"data.path: {path}", need_answer)


def split_eval(rows: list[Example], eval_size: int, where: str) -> tuple[list, list]:
    """(train, held-out): the last ``eval_size`` rows held out, or, for a data set that
    small, a tenth of it (at least one row), with a notice."""
    if len(rows) < 2:
        raise ValueError(
            f"{where}: {len(rows)} row(s); need at least 2 (1 to train, 1 to evaluate)"
        )
    n = eval_size
    if len(rows) <= eval_size:
        from rlpost.core.io.rundir import notice

        n = max(1, len(rows) // 10)
        notice(f"{where}: {len(rows)} rows <= data.eval_size={eval_size}; holding out {n}")
    return rows[:-n], rows[-n:]


def make_prompt_source(
    task_name: str,
    task_params: dict,
    path: str | None,
    eval_size: int,
    seed: int,
    need_answer: bool = True,
    dataset: Any = None,
    max_row_mb: float = 64.0,
) -> PromptSource:
    """Build the training stream and held-out set described by a ``DataConfig`` (or of
    ``dataset``, a ``datasets.Dataset`` given from Python). ``need_answer``: the rewards
    read the "answer" column."""
    if dataset is not None:
        rows = _rows_to_examples(dataset, "the train_dataset", need_answer)
        return PromptSource(*_train_eval(rows, eval_size, "the train_dataset", seed))
    if path is None:
        task = make_task(task_name, **task_params)
        held_out = task.sample(eval_size, random.Random(10_000 + seed))
        return PromptSource(None, task, held_out, seed)
    rows = _load_file(path, need_answer, max_row_mb)
    return PromptSource(*_train_eval(rows, eval_size, path, seed))


def _train_eval(rows: list[Example], eval_size: int, where: str, seed: int) -> tuple:
    train, held_out = split_eval(rows, eval_size, where)
    return train, None, held_out, seed


@dataclass(frozen=True)
class DomainScore:
    """The verifier of a mixture: each example scored by its domain's task (picklable);
    domains in ``silent`` score 0 (no reward: only distilled)."""

    tasks: dict[str, Task]
    silent: frozenset[str] = frozenset()

    def __call__(self, completion: str, example: Example) -> float:
        d = example.meta["domain"]
        if d in self.silent and not example.meta.get("heldout"):
            return 0.0  # no training reward; held-out examples are always verified
        return self.tasks[d].score(completion, example)


class MixtureSource:
    """Prompts from several task domains (``data.mixture``): each prompt's domain is drawn
    with probability proportional to its weight from one seeded stream, then the prompt
    from that domain's own stream; ``meta["domain"]`` names it. Held-out examples are
    kept per domain (``eval_sets``) and together (``eval_examples``)."""

    def __init__(self, domains: list[Any], eval_size: int, seed: int):
        self.names = [d.task for d in domains]
        self.silent = frozenset(d.task for d in domains if not getattr(d, "reward", True))
        self.weights = [float(d.weight) for d in domains]
        self.tasks = {d.task: make_task(d.task, **d.task_params) for d in domains}
        self.sources: dict[str, PromptSource] = {}
        self.eval_sets: dict[str, list[Example]] = {}
        for i, name in enumerate(self.names):
            rng = random.Random(10_000 + seed + i)
            held = [_domain(e, name, heldout=True) for e in self.tasks[name].sample(eval_size, rng)]
            self.sources[name] = PromptSource(None, self.tasks[name], held, seed + 7919 * i)
            self.eval_sets[name] = held
        self.eval_examples = [e for name in self.names for e in self.eval_sets[name]]
        self.task = None
        self.rng = random.Random(seed * 31 + 17)

    mean_of_sets = True  # the overall held-out accuracy: the domains' mean

    def set_step(self, step: int) -> None:
        """(The mixture is the same throughout.)"""

    def verifier(self):
        return DomainScore(self.tasks, self.silent)

    def named_eval_sets(self) -> dict[str, list[Example]]:
        return self.eval_sets

    def events(self, step: int) -> list[str]:
        return []

    def draw(self, name: str, n: int) -> list[Example]:
        """``n`` prompts of domain ``name`` (a scheduler's own choice of domain, ASTOR's)."""
        return [_domain(e, name) for e in self.sources[name].next_batch(n)]

    def next_batch(self, n: int) -> list[Example]:
        picks = self.rng.choices(self.names, weights=self.weights, k=n)
        return [_domain(self.sources[name].next_batch(1)[0], name) for name in picks]

    def state_dict(self) -> dict[str, Any]:
        st = self.rng.getstate()
        return {
            "rng": [st[0], list(st[1]), st[2]],
            "sources": {k: s.state_dict() for k, s in self.sources.items()},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.rng.setstate((sd["rng"][0], tuple(sd["rng"][1]), sd["rng"][2]))
        for k, s in self.sources.items():
            s.load_state_dict(sd["sources"][k])


def _domain(e: Example, name: str, heldout: bool = False) -> Example:
    meta = {**e.meta, "domain": name, **({"heldout": True} if heldout else {})}
    return Example(e.prompt, e.answer, meta)


# ------------------------------------------------------------------------ curriculum


@dataclass(frozen=True)
class StagedScore:
    """The verifier of a curriculum: ``tasks[example.meta["stage"]].score`` (picklable)."""

    tasks: tuple[Task, ...]

    def __call__(self, completion: str, example: Example) -> float:
        return self.tasks[int(example.meta["stage"])].score(completion, example)


class CurriculumSource:
    """Prompt streams of a sequence of tasks; :meth:`set_step` selects the current one."""

    def __init__(self, stages: list, eval_size: int, seed: int):
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

    mean_of_sets = False

    def set_step(self, step: int) -> None:
        self.stage = self.stage_at(step)

    def verifier(self):
        return StagedScore(self.tasks)

    def named_eval_sets(self) -> dict[str, list[Example]]:
        """Every task's held-out set (the current task's is also the overall one)."""
        return {n: s.eval_examples for n, s in zip(self.names(), self.sources, strict=True)}

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


def make_prompts(cfg: Any, need_answer: bool = True, dataset: Any = None):
    """The prompt source ``cfg.data`` describes (a curriculum, a mixture, a task or a
    file; ``dataset``: a ``datasets.Dataset`` given from Python)."""
    d = cfg.data
    if d.curriculum:
        return CurriculumSource(list(d.curriculum), d.eval_size, d.seed)
    if d.mixture:
        return MixtureSource(list(d.mixture), d.eval_size, d.seed)
    return make_prompt_source(
        d.task, dict(d.task_params), d.path, d.eval_size, d.seed, need_answer, dataset,
        d.max_row_mb,
    )  # fmt: skip
