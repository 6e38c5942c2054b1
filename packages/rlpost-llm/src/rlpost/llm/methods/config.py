"""The distillation section (``distill``): teachers, their top-K, the self-teacher's memory."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Property, Switch
from rlpost.core.io.schema import Strict as _Strict


class TeacherConfig(_Strict):
    """One teacher of on-policy distillation (``distill.teachers``)."""

    path: str
    """"self": the policy itself (self-distillation; give it a privileged ``template``);
    "tiny" / "tiny-random" as ``model.path`` (the tiny base of the teacher's first domain);
    else a local folder (an rlpost run directory stands for its newest checkpoint) or a hub
    id of a causal LM. A teacher with another tokenizer scores the completions' text,
    aligned to the student's tokens by text spans (the ``sampled`` estimator only)."""
    domains: list[str] = []
    """The ``example.meta["domain"]`` values this teacher scores (``data.mixture`` task
    names); empty: every prompt. A prompt goes to the first teacher that takes it; one no
    teacher takes is not distilled."""
    template: str | None = None
    """The teacher's prompt: a format string over ``{prompt}``, ``{answer}`` and the
    example's meta fields (OPSD's privileged context, e.g. ``"{answer}>{prompt}"``); for
    chat prompts it rewrites the last user message. None: the student's prompt."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: model.dtype
    engine: Literal["hf", "vllm"] = "hf"
    """``hf``: the teacher runs in this process with transformers; ``vllm``: on a vLLM
    engine (GPU, extra ``[vllm]``), its log-probs and top-K read from ``prompt_logprobs``
    (the student's tokenizer, sampling at temperature 1; not ``path: self``)."""
    gpu_memory_utilization: float = Field(0.2, gt=0, le=1)
    """The vLLM teacher's share of the GPU's memory."""


class MemoryConfig(_Strict):
    """The self-teacher's memory (``rlpost.llm.methods.memory``): RESD's reflections and playbook
    (``kind: playbook``, 000-26) or PMD's three-level procedural memory (``procedural``,
    004-22), filled from the run's rollouts and read by the teachers' ``template`` through
    ``{reflection}``, ``{playbook}`` (and ``{trajectory}``, ``{lessons}``, ``{patterns}``)."""

    kind: Literal["playbook", "procedural"] = "playbook"
    reflector: Literal["feedback", "policy"] = "feedback"
    """``feedback``: the task's verifier feedback is the reflection (built-in tasks);
    ``policy``: the policy writes it, greedily, from ``reflect_template``."""
    reflect_template: str = "{prompt}{response}\nfeedback: {feedback}\nWhat went wrong? "
    reflect_tokens: int = Field(32, ge=1)
    capacity: int = Field(32, ge=1)
    """Lessons the playbook keeps (the least met dropped first)."""
    show: int = Field(3, ge=1)
    """Lessons (and patterns) in each teacher context."""
    trajectories: int = Field(4096, ge=1)
    """Problems whose trajectories the procedural memory keeps (the least recent dropped)."""


class DistillConfig(_Strict):
    """The teachers of on-policy distillation presets (opd, opd_rl, mopd, atod, opsd,
    sdpo, resd, pmd): their log-probs on the student's own rollouts are the inputs the
    preset's distillation estimator declares."""

    teachers: list[TeacherConfig] = []
    topk: int = Field(16, ge=1)
    """K of the teacher's top-K ids (the ``topk`` estimator)."""
    memory: MemoryConfig | None = None

    @model_validator(mode="after")
    def _memory_is_read(self) -> DistillConfig:
        mem = self.memory
        if mem is None:
            return self
        from rlpost.llm.methods.memory import FIELDS

        used = [
            f for t in self.teachers for f in FIELDS[mem.kind]
            if t.template and "{" + f + "}" in t.template
        ]  # fmt: skip
        if not used:
            raise ValueError(
                f"distill.memory ({mem.kind}): no distill.teachers[].template reads it; "
                f"use {', '.join('{' + f + '}' for f in FIELDS[mem.kind])}"
            )
        return self


def _teacher_domains(cfg: Any, preset: Any, recipe: Any) -> None:
    """Each teacher's domains are among the data's."""
    domains = {d.task for d in cfg.data.mixture}
    for i, t in enumerate(cfg.distill.teachers):
        unknown = sorted(set(t.domains) - domains) if domains else sorted(t.domains)
        if unknown:
            raise ValueError(
                f"distill.teachers[{i}].domains: {unknown} not among the data domains "
                f"({', '.join(sorted(domains)) or 'none: set data.mixture'})"
            )


_MEMORY = [
    "algo.distill.name=topk",
    "distill.teachers=[{path: self, template: '{playbook}:{reflection}>{prompt}'}]",
    "distill.memory={kind: playbook}",
]
SWITCHES = (
    Switch.declare(
        "distill.memory",
        lambda cfg: cfg.distill.memory is not None,
        requires={Property.WHOLE_BATCH: "observes each step's whole batch"},
        example=_MEMORY,
    ),
    Switch.declare(
        "distill.memory.reflector=policy",
        lambda cfg: cfg.distill.memory is not None and cfg.distill.memory.reflector == "policy",
        requires={Property.SAME_THREAD: "writes with the rollout engine (train.pipeline sync)"},
        example=[*_MEMORY[:-1], "distill.memory={kind: playbook, reflector: policy}"],
    ),
    Switch.declare(
        "distill.memory.reflector=feedback",
        lambda cfg: cfg.distill.memory is not None and cfg.distill.memory.reflector == "feedback",
        requires={
            Property.VERIFIER_FEEDBACK: "needs a built-in task's verifier feedback "
            "(data.task or data.mixture; with data.path use reflector=policy)"
        },
        example=_MEMORY,
    ),
)

#: this section's checks of the whole config
CHECKS = (_teacher_domains,)
