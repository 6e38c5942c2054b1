"""Rubrics in words (RubricEM, catalog 000-30): a language model reads each criterion,
written in natural language, and judges whether a response meets it.

RubricEM's rubrics are "the shared interface that structures policy execution, judge
feedback, and agent memory": criteria such as "The query names the relation it asks
about", read by a judge model. :class:`WordJudge` asks a causal LM, for each criterion,
the question of its ``template`` and reads the answer off the next-token distribution:
``P(yes) / (P(yes) + P(no))`` over the first tokens of ``yes`` and ``no``, so a score is
the judge's calibrated belief, not a sampled word. A rubric's score is the mean over its
criteria.

Two uses:

* a TRL-style reward function, ``judge(prompts, completions, rubric=..., **columns)``:
  each row judged against its ``rubric`` column (a list of criteria), else the judge's
  own ``criteria``; pass it as ``Trainer(cfg, reward_funcs=[judge])`` (picklable: the
  model loads in the reward worker, on first use);
* the stage scores of Stage-Structured GRPO on multi-turn episodes
  (``data.env.judge``: a criteria list per stage of the environment's judge, e.g. the
  search world's ``research``, ``answer`` and ``plan``): the environment says which
  stage a turn belongs to, the judge model reads the turn (its action and what it got
  back) against that stage's criteria in words.

The model is any causal LM checkpoint (a local directory or a hub id, loaded through
safetensors); on our CPU there is no language model to read words well, so the tests
check the reading against an independent forward, and the plumbing with a scripted judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

TEMPLATE = (
    "Task: {task}\nResponse: {response}\nCriterion: {criterion}\n"
    "Does the response meet the criterion? Answer yes or no:"
)


class WordJudge:
    """A causal LM judging responses against criteria in words (module docstring).
    ``path``: the judge model; ``criteria``: the default rubric (a reward's rows without
    a ``rubric`` column); ``template`` over ``{task}``, ``{response}`` and
    ``{criterion}``; ``yes`` / ``no``: the answers whose first tokens are compared."""

    def __init__(
        self,
        path: str,
        criteria: Sequence[str] = (),
        template: str = TEMPLATE,
        yes: str = " yes",
        no: str = " no",
        micro_batch: int = 16,
    ):
        missing = [f for f in ("{task}", "{response}", "{criterion}") if f not in template]
        if missing:
            raise ValueError(f"judge template: missing {', '.join(missing)}")
        self.path, self.criteria, self.template = path, list(criteria), template
        self.yes, self.no, self.micro_batch = yes, no, micro_batch
        self._model = self._tok = None

    def __getstate__(self) -> dict[str, Any]:  # (to a reward worker: the path, not weights)
        return {**self.__dict__, "_model": None, "_tok": None}

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(self.path)
        model = AutoModelForCausalLM.from_pretrained(self.path, use_safetensors=True)
        self._model = model.eval()
        ids = [self._tok(w, add_special_tokens=False)["input_ids"] for w in (self.yes, self.no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise ValueError(
                f"judge: {self.yes!r} and {self.no!r} must start with different tokens "
                f"under {self.path}'s tokenizer"
            )
        self._answers = (ids[0][0], ids[1][0])

    @torch.no_grad()
    def probabilities(self, queries: Sequence[str]) -> Tensor:
        """``[N]``: for each full judge prompt, ``P(yes) / (P(yes) + P(no))`` of the
        next token."""
        if self._model is None:
            self._load()
        tok, model = self._tok, self._model
        out = torch.empty(len(queries))
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        for s in range(0, len(queries), self.micro_batch):
            rows = [
                tok(q, add_special_tokens=False)["input_ids"]
                for q in queries[s : s + self.micro_batch]
            ]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            last = logits[torch.arange(len(rows)), mask.sum(1) - 1]
            pair = last[:, list(self._answers)].log_softmax(-1)
            out[s : s + len(rows)] = pair[:, 0].exp()
        return out

    def scores(
        self, tasks: Sequence[str], responses: Sequence[str], rubrics: Sequence[Sequence[str]]
    ) -> list[float]:
        """Each response's rubric score: the mean over its rubric's criteria."""
        queries, owner = [], []
        for i, (task, response, rubric) in enumerate(zip(tasks, responses, rubrics, strict=True)):
            if not rubric:
                raise ValueError(f"judge: row {i} has no criteria to judge against")
            for c in rubric:
                queries.append(self.template.format(task=task, response=response, criterion=c))
                owner.append(i)
        p = self.probabilities(queries) if queries else torch.empty(0)
        total = torch.zeros(len(tasks)).index_add_(0, torch.tensor(owner, dtype=torch.long), p)
        counts = torch.tensor([len(r) for r in rubrics], dtype=torch.float)
        return (total / counts).tolist()

    def __call__(
        self, prompts: list, completions: list, rubric: list | None = None, **kwargs
    ) -> list[float]:
        """TRL's reward-function signature: each completion's rubric score, against its
        row's ``rubric`` column where the data has one, else :attr:`criteria`."""
        rubrics = rubric if rubric is not None else [self.criteria] * len(completions)
        tasks = [p if isinstance(p, str) else str(p) for p in prompts]
        responses = [c if isinstance(c, str) else str(c) for c in completions]
        return self.scores(tasks, responses, rubrics)


def turn_texts(ro: Any, tokenizer: Any) -> list[list[str]]:
    """Each episode's turns as text for a judge: the action as the environment read it,
    then ``" -> "`` and the observation it got back (decoded; none after the last)."""
    out = []
    for i, actions in enumerate(ro.actions):
        n = int(ro.batch.attention[i].sum())
        ids, turn = ro.batch.completion_ids[i, :n].tolist(), ro.turn_ids[i, :n].tolist()
        seen: list[list[int]] = [[] for _ in actions]  # each turn's observation ids
        u = -1
        for t, k in zip(ids, turn, strict=True):
            if k >= 0:
                u = k
            elif 0 <= u < len(seen):
                seen[u].append(t)
        texts = [tokenizer.decode(o, skip_special_tokens=True) for o in seen]
        out.append([a + (f" -> {o}" if o else "") for a, o in zip(actions, texts, strict=True)])
    return out


__all__ = ["TEMPLATE", "WordJudge", "turn_texts"]
