"""Teacher scores of on-policy distillation (``Input.TEACHER_*``): the teachers of
``distill.teachers`` (:class:`~rlpost.llm.methods.distill.Teachers`: frozen models, the
policy under a privileged template, another tokenizer's model) score the student's own
rollouts; the preset's row filter (OPSD's) and token choice (SD-Search's queries) say
where the signal applies. The self-teacher's memory (RESD's playbook, PMD's procedural
memory, ``distill.memory``) sees each step's rollouts first and fills the teachers'
contexts. With an estimator reading teacher log-probs (StepOPSD), the student's are the
same forward code's (pi_old), so a context that tells the teacher nothing gives a gap of
exactly 0."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.core.contract import Declares, Input, Property
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Task, make_task
from rlpost.llm.methods.distill import Teachers, TeacherScores, student_distributions
from rlpost.llm.methods.memory import TeacherMemory
from rlpost.llm.model.policy import pack_layout
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider

_TEACHER_INPUTS = frozenset({Input.TEACHER_LOGPROBS, Input.TEACHER_TOPK, Input.TEACHER_FULL})


def run_tasks(cfg: Any) -> dict[str, Task]:
    """The built-in task of each domain (``""``: the run's single task; a curriculum's
    stages by their index, ``"0"``, ``"1"``, ...): the verifier feedback the memory's
    reflector reads (:func:`rlpost.llm.methods.memory.task_key`)."""
    if cfg.data.mixture:
        return {d.task: make_task(d.task, **d.task_params) for d in cfg.data.mixture}
    if cfg.data.curriculum:
        return {
            str(i): make_task(c.task, **c.task_params) for i, c in enumerate(cfg.data.curriculum)
        }
    return {"": make_task(cfg.data.task, **cfg.data.task_params)}


@INPUT_PROVIDERS.register
class TeachersProvider(InputProvider):
    name = "teachers"
    label = "distill.teachers"
    order = 60
    provides = frozenset({*_TEACHER_INPUTS, Input.TEACHER_SPANS})
    hint = "set distill.teachers, e.g. distill.teachers='[{path: tiny}]'"
    state_key = "memory"
    example = ("algo.distill.name=sampled", "distill.teachers=[{path: self}]")
    declares = Declares(requires={Property.UNSHARDED: "score with the policy's whole weights"})

    @classmethod
    def available(cls, cfg: Any) -> bool:
        return bool(cfg.distill.teachers) or cfg.copd is not None  # (CoPD: the peers)

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        return bool(cfg.distill.teachers)

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        if cfg.distill.teachers and cfg.copd is None and not _TEACHER_INPUTS & set(recipe.reads()):
            raise ValueError(
                f"distill.teachers is set but nothing in preset {preset.name!r} reads a "
                "teacher: use a distillation preset (opd, opd_rl, mopd, atod, opsd, sdpo), "
                "step_opsd, or set algo.distill"
            )

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        t = trainer
        self.teachers = Teachers.from_config(t.cfg, t.tok)
        reads = t.reads
        self.topk = t.cfg.distill.topk if Input.TEACHER_TOPK in reads else None
        self.full = Input.TEACHER_FULL in reads
        if self.topk is not None or self.full:
            cross = [x.name for x in self.teachers.teachers if x.cross]
            if cross:
                raise ValueError(
                    f"{', '.join(cross)}: a tokenizer other than the student's supports the "
                    "sampled estimator only (algo.distill.name=sampled)"
                )
        self.rescored = Input.TEACHER_LOGPROBS in t.recipe.advantage.reads  # StepOPSD
        self.memory = self._memory() if t.cfg.distill.memory is not None else None
        self.scores: TeacherScores | None = None

    def _memory(self) -> TeacherMemory:
        """RESD's / PMD's memory; the policy reflector writes with the engine, greedily."""
        t = self.trainer
        mc = t.cfg.distill.memory

        def generate(prompts: list[str]) -> list[str]:
            ids = [encode_prompt(t.tok, p) for p in prompts]
            greedy = SamplingParams(mc.reflect_tokens, 0.0, stop=t.sampling.stop)
            return t.engine.generate(ids, 1, greedy).texts(t.tok)

        return TeacherMemory(mc, run_tasks(t.cfg), generate)

    def provide(self, step: Any) -> None:
        t, col = self.trainer, step.col
        examples = col.examples
        if self.memory is not None:  # this step's rollouts update it, then it fills contexts
            texts = col.batch.texts(t.tok)
            examples = self.memory.observe(examples, texts, col.accuracy.bool().tolist(), t.step)
        m = t.cfg.model
        teach = self.teachers.score(
            col.batch, examples, t.model, temperature=t.sampling.temperature, topk=self.topk,
            full=self.full, micro_batch=t.cfg.optim.micro_batch_size, pack=m.pack_prompts,
            layout=pack_layout(m.pack_layout, t.model), impl=m.logprob_impl,
        )  # fmt: skip
        rows = teach.rows * t.recipe.distill_row_mask(col.accuracy)
        tokens = torch.ones_like(step.mask)
        if t.preset.distill_tokens == "queries":  # SD-Search: the search queries only
            if col.query_mask is None:
                raise ValueError("distill_tokens=queries needs multi-turn episodes (data.env)")
            tokens = col.query_mask
        mask = rows[:, None] * tokens
        self.scores = teach
        step[Role.TEACHER_MASK] = mask
        step[Input.TEACHER_LOGPROBS] = teach.logp
        if teach.spans is not None:
            step[Input.TEACHER_SPANS] = teach.spans
        if self.rescored:  # the advantage's teacher and student from the same forward code
            old, b = step[Role.OLD_LOGP], step.batch
            step[Input.BEHAVIOUR_LOGPROBS] = old * b.mask
            scored = mask > 0  # unscored rows: the student's own (gap 0)
            step[Input.TEACHER_LOGPROBS] = torch.where(scored, teach.logp, old) * b.mask

    def forward_kwargs(self, mb: Any) -> dict[str, Any]:
        ids = self._student_ids(mb)
        return {} if ids is None else {"student_ids": ids}

    def _student_ids(self, mb: Any):
        """The ids the student's training forward scores differentiably: the vocabulary for
        the full estimator, the teacher's top-K for ``topk``, none for ``sampled``."""
        teach = self.scores
        if teach.full is not None:
            v = teach.full.shape[-1]
            head = self.trainer.model.get_output_embeddings().weight.shape[0]
            if head != v:
                raise ValueError(
                    f"the full-vocabulary estimator: the student has {head} vocabulary rows, "
                    f"the teacher {v}"
                )
            return torch.arange(v).expand(*mb.sub.completion_ids.shape, v)
        return teach.topk[0][mb.idx] if teach.topk is not None else None

    def from_forward(self, mb: Any, out: tuple) -> dict[Any, Any]:
        teach = self.scores
        if teach.full is None and teach.topk is None:
            return {}
        ids = self._student_ids(mb)
        t = teach.full[mb.idx] if teach.full is not None else teach.topk[1][mb.idx]
        d = student_distributions(out[-1], t, ids, mb.sub.completion_ids)
        return {Input.TEACHER_FULL if teach.full is not None else Input.TEACHER_TOPK: d}

    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        if self.memory is not None:
            metrics.update(self.memory.metrics())

    def state_dict(self) -> tuple[Any, dict]:
        return (self.memory.state_dict() if self.memory is not None else None), {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        if self.memory is not None and state is not None:
            self.memory.load_state_dict(state)
