"""Preference pairs: the embedded default built from a task, TRL-format files, token layout.

* task-built (the embedded default): one pair per prompt, chosen = the task's reference
  answer, rejected = a wrong answer made by perturbing it (off by one, off by ten, or one
  digit changed; checked wrong by the task's verifier), deterministic given the seed.
  Training prompts are drawn with ``random.Random(seed)`` and exclude the held-out prompts,
  which are :class:`rlpost.llm.data.prompts.PromptSource`'s (``random.Random(10_000 + seed)``, the
  GRPO trainer's held-out set).
* file-backed: a local JSONL / parquet with TRL's ``prompt``, ``chosen``, ``rejected``
  columns, loaded with ``datasets``: plain text, or TRL's conversational format (the
  prompt a list of messages, chosen and rejected the assistant's messages), rendered with
  the tokenizer's chat template as TRL does (the prompt with the generation prompt, each
  completion the rest of the rendered conversation). The last ``eval_size`` rows are held
  out (a tenth of a smaller file).

Completions are tokenized without special tokens and end with the tokenizer's EOS (the
embedded model is trained on ``prompt + answer + <eos>``). Left out: TRL's implicit-prompt
format (no ``prompt`` column) and truncation to a maximum length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from rlpost.core.io.config import ConfigError
from rlpost.llm.data.tasks import Example, Task

COLUMNS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: ``chosen`` is preferred to ``rejected`` as a completion of ``prompt``;
    ``example`` is the task instance when the pair comes from a task."""

    prompt: str | list[dict]
    chosen: str | list[dict]
    rejected: str | list[dict]
    example: Example | None = None

    def texts(self, tokenizer) -> tuple[str, str, str]:
        """(prompt, chosen, rejected) as text: as they are, or a conversation rendered with
        ``tokenizer``'s chat template (the completions: what the template adds after the
        prompt and its generation prompt)."""
        if isinstance(self.prompt, str):
            return self.prompt, self.chosen, self.rejected  # type: ignore[return-value]
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "data.path: conversational pairs (lists of messages) but the model's "
                "tokenizer has no chat template: use plain-text pairs or a chat model"
            )
        render = tokenizer.apply_chat_template
        prompt = render(self.prompt, tokenize=False, add_generation_prompt=True)

        def completion(messages: list[dict]) -> str:
            full = render([*self.prompt, *messages], tokenize=False)
            if not full.startswith(prompt):
                raise ConfigError(
                    "data.path: the chat template renders a conversation that does not "
                    "start with its prompt; preference pairs need a template that appends"
                )
            return full[len(prompt) :]

        return prompt, completion(self.chosen), completion(self.rejected)


def perturb_answer(task: Task, example: Example, rng: random.Random, tries: int = 32) -> str:
    """A wrong answer near ``example.answer``: for an integer, +-1, +-10 or one digit changed
    (never negative); otherwise one digit character changed. Kept only if ``task.score``
    gives it 0; after ``tries`` failed draws, the first draw that differs from the answer
    (or the answer with ``"1"`` appended) is returned."""
    ans = example.answer
    digits = [i for i, ch in enumerate(ans) if ch.isdigit()]
    first = None
    for _ in range(tries):
        kind = rng.choice(("+1", "-1", "+10", "-10", "digit"))
        if ans.lstrip("-").isdigit() and kind != "digit":
            cand = str(max(0, int(ans) + int(kind)))
        elif digits:
            i = rng.choice(digits)
            new = rng.choice([d for d in "0123456789" if d != ans[i]])
            if i == 0 and new == "0" and len(ans) > 1 and ans.isdigit():
                new = rng.choice("123456789".replace(ans[0], ""))  # no leading zero
            cand = ans[:i] + new + ans[i + 1 :]
        else:
            cand = ans + "1"
        if cand == ans:
            continue
        first = first or cand
        if task.score(cand, example) == 0.0:
            return cand
    return first or ans + "1"


def task_pairs(task: Task, examples: list[Example], seed: int) -> list[PreferencePair]:
    """One pair per example: (reference answer, :func:`perturb_answer`), deterministic in
    ``seed`` and the examples."""
    rng = random.Random(f"rejected-{seed}")
    return [PreferencePair(e.prompt, e.answer, perturb_answer(task, e, rng), e) for e in examples]


def sample_train_examples(
    task: Task, n: int, seed: int, exclude: set[str], max_rounds: int = 50
) -> list[Example]:
    """``n`` task examples from ``random.Random(seed)`` whose prompts are not in
    ``exclude`` (the held-out prompts)."""
    rng = random.Random(seed)
    out: list[Example] = []
    for _ in range(max_rounds):
        out += [e for e in task.sample(n - len(out), rng) if e.prompt not in exclude]
        if len(out) >= n:
            return out
    raise ConfigError(f"data.train_size={n}: the task has too few prompts outside the held-out set")


def load_pair_file(
    path: str, progress: bool = True, max_row_mb: float = 64.0
) -> list[PreferencePair]:
    """The rows of a TRL-format preference file (``prompt``, ``chosen``, ``rejected``);
    ``progress=False`` silences ``datasets``' progress bars while loading.

    Raises :class:`ConfigError` (one line) for a missing file, a missing column or a
    non-string cell (TRL's conversational format is not supported)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"data.path: no such file {path}")
    from rlpost.core.io.rows import check_json_lines, is_json_lines

    if is_json_lines(p):
        check_json_lines(p, max_row_mb=max_row_mb)
    import datasets

    kind = "parquet" if path.endswith(".parquet") else "json"
    bars = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(kind, data_files=str(p), split="train")
    except Exception as exc:  # malformed JSON / parquet
        raise ConfigError(f"data.path: cannot read {path}: {exc}") from exc
    finally:
        if bars:
            datasets.enable_progress_bars()
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"data.path: {path} is missing column(s) {missing}; preference data needs "
            f"{list(COLUMNS)}, found {ds.column_names}"
        )
    from rlpost.llm.data.tasks import is_conversational

    pairs = []
    for i, row in enumerate(ds):
        kinds = {
            "text" if isinstance(row[c], str) else "chat" if is_conversational(row[c]) else "?"
            for c in COLUMNS
        }
        if len(kinds) > 1 or "?" in kinds:
            raise ConfigError(
                f"data.path: {path} row {i}: {list(COLUMNS)} must all be plain strings or "
                "all lists of {'role', 'content'} messages (TRL's conversational format)"
            )
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"]))
    return pairs


@dataclass
class TokenPairs:
    """Tokenized pairs: ``N`` prompts and their chosen / rejected completions (unpadded
    token-id lists; completions include their final EOS)."""

    prompt_ids: list[list[int]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    pad_id: int

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @staticmethod
    def from_pairs(pairs: list[PreferencePair], tokenizer) -> TokenPairs:
        eos = tokenizer.eos_token_id
        tail = [eos] if eos is not None else []

        def enc(texts: list[str]) -> list[list[int]]:
            if not texts:
                return []
            return tokenizer(texts, add_special_tokens=False)["input_ids"]

        texts = [p.texts(tokenizer) for p in pairs]
        prompts = enc([t[0] for t in texts])

        def ended(ids: list[int]) -> list[int]:  # (a chat template may end with EOS itself)
            return ids if ids and tail and ids[-1] == tail[0] else ids + tail

        chosen = [ended(ids) for ids in enc([t[1] for t in texts])]
        rejected = [ended(ids) for ids in enc([t[2] for t in texts])]
        for i, (c, r) in enumerate(zip(chosen, rejected, strict=True)):
            if not prompts[i] or not c or not r:
                raise ConfigError(f"pair {i}: empty prompt or completion after tokenization")
        return TokenPairs(prompts, chosen, rejected, int(tokenizer.pad_token_id))

    def rows(self, idx: list[int]) -> tuple[list[list[int]], Tensor, Tensor]:
        """The ``b = len(idx)`` pairs as ``2b`` rows, chosen first: ``(prompt ids [2b],
        completion ids [2b, L] right-padded with pad_id, mask [2b, L])``; row ``i`` and row
        ``b + i`` are pair ``idx[i]``'s chosen and rejected completions."""
        comps = [self.chosen_ids[i] for i in idx] + [self.rejected_ids[i] for i in idx]
        prompts = [self.prompt_ids[i] for i in idx] * 2
        L = max(len(c) for c in comps)
        ids = torch.full((len(comps), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(comps), L)
        for j, c in enumerate(comps):
            ids[j, : len(c)] = torch.tensor(c, dtype=torch.long)
            mask[j, : len(c)] = 1.0
        return prompts, ids, mask
