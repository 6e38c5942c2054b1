"""Teachers of on-policy distillation: who scores the student's own rollouts.

A :class:`Teacher` is a causal LM with the student's tokenizer: a frozen model loaded
beside the policy (OPD, one per domain for MOPD) or the policy itself (``path: self``,
self-distillation) given a privileged context through its prompt ``template`` (OPSD's
reference answer). :class:`Teachers` routes each row to the first teacher whose
``domains`` take its example's ``meta["domain"]`` (MOPD's routed reverse KL) and returns,
for the rows it routed, what the preset's distillation estimator declared:

* the teacher's log-probs of the sampled tokens (``Input.TEACHER_LOGPROBS``);
* its top-K ids and their log-probs (``Input.TEACHER_TOPK``), whose ids the student's
  training forward then scores differentiably;
* its log-probs over the whole vocabulary (``Input.TEACHER_FULL``).

A teacher whose tokenizer differs from the student's (cross-tokenizer distillation)
scores the *text* of each completion: the text is retokenised with the teacher's
tokenizer and aligned to the student's tokens by text spans (:mod:`rlpost.llm.model.tokalign`);
its log-prob of each aligned block (the sum over its own tokens) is placed on the block's
last student token, and ``Input.TEACHER_SPANS`` gives each student token its block, which
the ``sampled`` estimator then compares block by block (top-K and full-vocabulary
estimators need one vocabulary and are refused).

Every teacher forward runs without gradients, at the sampling temperature (so a student
equal to its teacher has zero loss), in micro-batches of the trainer's size.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.distill import TeacherDistributions
from rlpost.llm.data.prompts import encode_prompt, is_conversational
from rlpost.llm.data.tasks import Example
from rlpost.llm.methods.config import TeacherConfig
from rlpost.llm.model.policy import (
    DTYPES,
    completion_logprobs,
    eval_mode,
    make_seq_batch,
    sampled_index,
)
from rlpost.llm.rollout.engines.base import RolloutBatch


@dataclass
class TeacherScores:
    """The teachers' side of a rollout batch (``[N, L]`` unless noted, 0 off the rows).

    ``rows`` ``[N]``: 1 where a teacher scored the row; ``logp``: log-probs of the sampled
    tokens (a cross-tokenizer teacher's block log-probs on each block's last token);
    ``topk``: ``(ids, logp)`` ``[N, L, K]``; ``full``: ``[N, L, V]``; ``which`` ``[N]``:
    the teacher's index (-1: none); ``spans``: each token's block (one per token for
    teachers with the student's tokenizer), when any teacher tokenises differently."""

    rows: Tensor
    logp: Tensor
    which: Tensor
    topk: tuple[Tensor, Tensor] | None = None
    full: Tensor | None = None
    spans: Tensor | None = None  # [N, L] text block of each token (cross-tokenizer teachers)


def student_distributions(
    student: Tensor, teacher: Tensor, ids: Tensor, tokens: Tensor
) -> TeacherDistributions:
    """Both policies over the same ids, the student's differentiable."""
    return TeacherDistributions(student, teacher.to(student.device), sampled_index(ids, tokens))


def teacher_prompt(template: str | None, example: Example) -> Any:
    """The teacher's prompt for ``example``: ``template`` over ``{prompt}``, ``{answer}`` and
    the meta fields (for chat prompts, applied to the last user message), or the prompt."""
    if template is None:
        return example.prompt

    def fill(text: str) -> str:
        fields = {**{k: v for k, v in example.meta.items()}, "prompt": text}
        fields["answer"] = example.answer
        try:
            return template.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"distill.teachers[].template {template!r}: {exc!r} (fields: "
                f"{', '.join(sorted(fields))})"
            ) from None

    if not is_conversational(example.prompt):
        return fill(str(example.prompt))
    msgs = copy.deepcopy(list(example.prompt))
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError("distill.teachers[].template: the chat prompt has no user message")
    msgs[last]["content"] = fill(str(msgs[last]["content"]))
    return msgs


class Teacher:
    """One teacher: ``model`` (``None``: the policy, passed at scoring time), its prompt
    ``template`` and the ``domains`` it takes (empty: all)."""

    def __init__(
        self,
        model: torch.nn.Module | None,
        domains: list[str] | tuple[str, ...] = (),
        template: str | None = None,
        name: str = "teacher",
        tokenizer=None,
        scorer=None,
    ):
        self.model = model
        self.domains = tuple(domains)
        self.template = template
        self.name = name
        self.tokenizer = tokenizer  # None: the student's; else a cross-tokenizer teacher
        self.scorer = scorer  # a VLLMScorer: the teacher on a vLLM engine (no model here)
        if model is not None:
            model.eval().requires_grad_(False)

    @property
    def is_self(self) -> bool:
        return self.model is None and self.scorer is None

    @property
    def cross(self) -> bool:
        return self.tokenizer is not None

    def takes(self, example: Example) -> bool:
        return not self.domains or example.meta.get("domain") in self.domains


def load_teacher(tc: TeacherConfig, cfg: Any, student_tokenizer, index: int = 0) -> Teacher:
    """Build the teacher ``tc`` describes; its tokenizer must be the student's."""
    name = f"distill.teachers[{index}]"
    if tc.path == "self":
        if tc.engine == "vllm":
            raise ValueError(f"{name}: the self-teacher is the policy: engine hf only")
        return Teacher(None, tc.domains, tc.template, name)
    if tc.engine == "vllm":
        return _vllm_teacher(tc, cfg, student_tokenizer, name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.llm.model import tiny

    dtype = DTYPES[tc.dtype or cfg.model.dtype]
    if tc.path in ("tiny", "tiny-random"):
        task = tc.domains[0] if tc.domains else cfg.data.task
        params = next((d.task_params for d in cfg.data.mixture if d.task == task), None)
        params = cfg.data.task_params if params is None else params
        if tc.path == "tiny":
            model, tok = tiny.load_base(tiny.build_base(task, progress=False, **params))
        else:
            from transformers import Qwen2ForCausalLM

            tok = tiny.build_tokenizer()
            with torch.random.fork_rng():
                torch.manual_seed(cfg.run.seed + 1 + index)
                model = Qwen2ForCausalLM(tiny.tiny_config(tok))
    else:
        path = _resolve_run(tc.path, name)
        try:
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{name}: cannot load {tc.path!r}: {first}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    cross = tok if tok.get_vocab() != student_tokenizer.get_vocab() else None
    return Teacher(model.to(dtype), tc.domains, tc.template, name, cross)


def _resolve_run(path: str, name: str) -> str:
    """A run directory stands for its newest finished checkpoint (``checkpoints/step-*``)."""
    from pathlib import Path

    from rlpost.core.io.checkpoint import latest_checkpoint

    p = Path(path)
    if not p.exists() and (p.is_absolute() or (p.parent.is_dir() and str(p.parent) != ".")):
        raise ValueError(  # a local path (its folder exists), not a hub id: fail fast
            f"{name}: no folder {path} (train that teacher first, e.g. rlpost-llm train "
            f"--config <recipe> run.dir={path})"
        )
    ckpts = p / "checkpoints"
    if not ckpts.is_dir():
        return path
    found = latest_checkpoint(ckpts)
    if found is None:
        raise ValueError(f"{name}: the run {path} has no finished checkpoint yet")
    return str(found)


def _vllm_teacher(tc: TeacherConfig, cfg: Any, student_tokenizer, name: str) -> Teacher:
    """A frozen teacher on a vLLM engine (GPU): the student's tokenizer, temperature 1."""
    from rlpost.llm.rollout.engines.vllm import VLLMScorer

    if cfg.rollout.temperature != 1.0:
        raise ValueError(
            f"{name}: a vLLM teacher's prompt log-probs are at temperature 1; sample the "
            f"student at rollout.temperature=1.0 (got {cfg.rollout.temperature})"
        )
    if tc.path in ("tiny", "tiny-random"):
        raise ValueError(f"{name}: a vLLM teacher loads a folder or hub id, not {tc.path!r}")
    path = _resolve_run(tc.path, name)
    dtype = tc.dtype or cfg.model.dtype
    scorer = VLLMScorer(path, tc.gpu_memory_utilization, dtype)
    if scorer.vocab_size != len(student_tokenizer):
        raise ValueError(
            f"{name}: the vLLM teacher's tokenizer has {scorer.vocab_size} tokens, the "
            f"student's {len(student_tokenizer)}: a vLLM teacher needs the student's tokenizer"
        )
    return Teacher(None, tc.domains, tc.template, name, scorer=scorer)


class Teachers:
    """The routed set of teachers of a run (``distill.teachers``)."""

    def __init__(self, teachers: list[Teacher], tokenizer):
        if not teachers:
            raise ValueError("distill.teachers: at least one teacher")
        self.teachers = teachers
        self.tok = tokenizer

    @classmethod
    def from_config(cls, cfg: Any, tokenizer) -> Teachers:
        return cls(
            [load_teacher(t, cfg, tokenizer, i) for i, t in enumerate(cfg.distill.teachers)],
            tokenizer,
        )

    def route(self, examples: list[Example]) -> Tensor:
        """``[N]`` index of the teacher of each row's example (-1: none takes it)."""
        out = []
        for e in examples:
            out.append(next((i for i, t in enumerate(self.teachers) if t.takes(e)), -1))
        return torch.tensor(out, dtype=torch.long)

    @torch.no_grad()
    def score(
        self,
        batch: RolloutBatch,
        examples: list[Example],
        policy: torch.nn.Module,
        *,
        temperature: float,
        topk: int | None,
        full: bool,
        micro_batch: int,
        pack: bool,
        layout: str,
        impl: str = "auto",
    ) -> TeacherScores:
        """Each routed row scored by its teacher (``policy`` serves the self-teacher)."""
        N, L = batch.completion_ids.shape
        which = self.route(examples)
        spans = self._cross_spans(N, L, topk, full)
        logp = torch.zeros(N, L)
        top = (torch.zeros(N, L, topk, dtype=torch.long), torch.zeros(N, L, topk)) if topk else None
        whole = None
        for t_idx, teacher in enumerate(self.teachers):
            rows = torch.nonzero(which == t_idx).flatten()
            if not len(rows):
                continue
            if teacher.scorer is not None:
                if full:
                    raise ValueError(
                        f"{teacher.name}: a vLLM teacher gives log-probs and top-K, not the "
                        "whole vocabulary: use algo.distill.name=topk or sampled"
                    )
                self._score_vllm(teacher, batch, examples, rows, topk, micro_batch, logp, top)
                continue
            model = policy if teacher.is_self else teacher.model
            assert model is not None
            if teacher.cross:
                assert spans is not None
                with eval_mode(model):
                    self._score_cross(teacher, model, batch, examples, rows, temperature,
                                      micro_batch, logp, spans, which)  # fmt: skip
                continue
            whole = self._vocab_buffer(teacher, model, whole, full, N, L)
            with eval_mode(model):
                self._score_model(teacher, model, batch, examples, rows, logp, top, whole,
                                  temperature=temperature, topk=topk, micro_batch=micro_batch,
                                  pack=pack, layout=layout, impl=impl)  # fmt: skip
        rows_mask = (which >= 0).float()
        return TeacherScores(rows_mask, logp, which, top, whole, spans)

    def _cross_spans(self, N: int, L: int, topk: int | None, full: bool) -> Tensor | None:
        """``[N, L]`` each student token's text block, one token per block until a teacher
        of another tokenizer fills its rows' (``None`` when every teacher has the student's
        tokenizer); such a teacher refuses the top-K and full-vocabulary estimators."""
        if not any(t.cross for t in self.teachers):
            return None
        if topk or full:
            names = ", ".join(t.name for t in self.teachers if t.cross)
            raise ValueError(
                f"{names}: a tokenizer other than the student's supports the sampled "
                "estimator only (algo.distill.name=sampled)"
            )
        return torch.arange(L).expand(N, L).clone()  # one token per block by default

    @staticmethod
    def _vocab_buffer(teacher, model, whole: Tensor | None, full: bool, N: int, L: int):
        """The ``[N, L, V]`` buffer of the full-vocabulary log-probs (``full``), made at
        the first in-process teacher; every teacher must have its ``V`` vocabulary rows."""
        v = int(model.get_output_embeddings().weight.shape[0])
        if full and whole is not None and v != whole.shape[-1]:
            raise ValueError(
                f"{teacher.name}: {v} vocabulary rows, another teacher has {whole.shape[-1]}: "
                "the full-vocabulary estimator needs one vocabulary"
            )
        if full and whole is None:
            whole = torch.zeros(N, L, v)
        return whole

    def _prompts(self, teacher, batch, examples, idx: list[int]) -> list[list[int]]:
        """The prompt ids the teacher reads for rows ``idx``: the student's, or its
        ``template`` filled from each row's example (in the student's tokenizer)."""
        return [
            encode_prompt(self.tok, teacher_prompt(teacher.template, examples[i]))
            if teacher.template is not None
            else batch.prompt_ids[i]
            for i in idx
        ]

    def _score_model(
        self,
        teacher,
        model,
        batch,
        examples,
        rows,
        logp,
        top,
        whole,
        *,
        temperature,
        topk,
        micro_batch,
        pack,
        layout,
        impl,
    ) -> None:
        """Score ``rows`` with an in-process teacher of the student's tokenizer (fills
        ``logp``, and ``top`` / ``whole`` when given, in place)."""
        L = batch.completion_ids.shape[1]
        for s in range(0, len(rows), micro_batch):
            idx = rows[s : s + micro_batch]
            sb = make_seq_batch(
                self._prompts(teacher, batch, examples, idx.tolist()), batch.completion_ids[idx],
                batch.mask[idx], batch.pad_id, pack=pack, layout=layout,
                attend=batch.attention[idx],
            )  # fmt: skip
            m = batch.mask[idx]
            want: int | Tensor | None = topk
            if whole is not None:  # the vocabulary's log-probs (top-K taken from them)
                want = torch.arange(whole.shape[-1]).expand(len(idx), L, -1)
            res = completion_logprobs(model, sb, temperature, impl=impl, dists=want)
            logp[idx] = res[0].float().cpu() * m
            if want is None:
                continue
            ids, lp = res[2][0].cpu(), res[2][1].float().cpu() * m[..., None]
            if whole is not None:
                whole[idx] = lp
                if top is not None:
                    lp, ids = lp.topk(topk, dim=-1)
            if top is not None:
                top[0][idx], top[1][idx] = ids, lp

    def _score_vllm(self, teacher, batch, examples, rows, topk, micro_batch, logp, top) -> None:
        """Score ``rows`` with a teacher on vLLM (fills ``logp`` and ``top`` in place)."""
        for s in range(0, len(rows), micro_batch):
            idx = rows[s : s + micro_batch].tolist()
            prompts = self._prompts(teacher, batch, examples, idx)
            comps = [batch.completion_ids[i, : int(batch.mask[i].sum())].tolist() for i in idx]
            for i, (lps, tops) in zip(idx, teacher.scorer.score(prompts, comps, topk), strict=True):
                n = len(lps)
                logp[i, :n] = torch.tensor(lps)
                if top is None:
                    continue
                if any(len(t) < topk for t in tops):
                    raise ValueError(f"{teacher.name}: vLLM returned fewer than {topk} log-probs")
                top[0][i, :n] = torch.tensor(
                    [[t for t, _ in pos] for pos in tops], dtype=torch.long
                )
                top[1][i, :n] = torch.tensor([[v for _, v in pos] for pos in tops])

    def _score_cross(
        self, teacher, model, batch, examples, rows, temperature, micro_batch, logp, spans, which
    ) -> None:
        """Score ``rows`` with a teacher of another tokenizer, block by block (fills
        ``logp`` and ``spans`` in place; a row whose text cannot be aligned is dropped
        from ``which``)."""
        from rlpost.llm.model.tokalign import Tokenized, align, block_sums, tokenize

        tt = teacher.tokenizer
        eos_s, eos_t = self.tok.eos_token_id, tt.eos_token_id
        for s in range(0, len(rows), micro_batch):
            idx = rows[s : s + micro_batch].tolist()
            prompts, comps, plans = [], [], []
            for i in idx:
                n = int(batch.mask[i].sum())
                body = batch.completion_ids[i, :n].tolist()
                has_eos = bool(body) and body[-1] == eos_s
                body = body[:-1] if has_eos else body
                pieces = [self.tok.decode([t]) for t in body]
                text = "".join(pieces)
                if self.tok.decode(body) != text:  # per-token pieces do not add up: skip
                    which[i] = -1
                    continue
                ends = [sum(len(p) for p in pieces[: j + 1]) for j in range(len(pieces))]
                a = Tokenized(
                    text, body, [(e - len(p), e) for e, p in zip(ends, pieces, strict=True)]
                )
                b = tokenize(tt, text)
                al = align(a, b)
                ex = examples[i]
                prompts.append(encode_prompt(tt, teacher_prompt(teacher.template, ex)))
                comps.append(b.ids + ([eos_t] if has_eos else []))
                plans.append((i, al, len(b.ids), has_eos, len(body)))
            if not plans:
                continue
            width = max(1, max(len(c) for c in comps))
            pad = tt.pad_token_id if tt.pad_token_id is not None else eos_t
            ids = torch.full((len(comps), width), pad, dtype=torch.long)
            mask = torch.zeros(len(comps), width)
            for r, c in enumerate(comps):
                ids[r, : len(c)] = torch.tensor(c, dtype=torch.long)
                mask[r, : len(c)] = 1.0
            sb = make_seq_batch(prompts, ids, mask, pad)
            lp = completion_logprobs(model, sb, temperature)[0].float().cpu() * mask
            for r, (i, al, nb, has_eos, na) in enumerate(plans):
                logp[i] = 0.0
                blocks = block_sums(lp[r, :nb], al.b)  # the teacher's log-prob of each block
                for k, ((a0, a1), t_k) in enumerate(zip(al.a, blocks.tolist(), strict=True)):
                    logp[i, a1 - 1] = t_k
                    spans[i, a0:a1] = k
                if has_eos:  # the end of the response is one more block
                    logp[i, na] = lp[r, nb]
                    spans[i, na] = len(al)


__all__ = [
    "Teacher",
    "TeacherScores",
    "Teachers",
    "load_teacher",
    "student_distributions",
    "teacher_prompt",
]
