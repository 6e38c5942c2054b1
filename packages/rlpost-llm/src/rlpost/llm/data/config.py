"""The data sections: the training prompts (``data``: a task, a file, a curriculum, a
mixture of domains or a multi-turn environment) and auxiliary data sets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Property, Switch
from rlpost.core.io.schema import Strict as _Strict

TaskName = Literal["arithmetic", "countdown", "knapsack", "pde", "chat"]


class TaskStage(_Strict):
    """One task of a continual sequence (``data.curriculum``)."""

    task: TaskName
    task_params: dict[str, Any] = {}
    steps: int = Field(ge=1)


class TransferTask(_Strict):
    """A task evaluated, never trained on (``data.transfer``)."""

    task: TaskName
    task_params: dict[str, Any] = {}


class MixtureDomain(_Strict):
    """One domain of a multi-domain prompt mixture (``data.mixture``)."""

    task: TaskName
    task_params: dict[str, Any] = {}
    weight: float = Field(1.0, gt=0)
    reward: bool = True
    """False: the domain's prompts earn no verifier reward (they are only distilled, as a
    CoPD expert's peers' domains are); its accuracy still counts in the metrics."""


class WordJudgeConfig(_Strict):
    """Rubrics in words (RubricEM, 000-30; :class:`rlpost.llm.rollout.judge.WordJudge`): a
    judge model reads each turn against its stage's criteria, written in natural
    language."""

    path: str
    """The judge: a causal LM checkpoint (a local directory or a hub id)."""
    criteria: dict[str, list[str]]
    """Criteria in words per stage name of the environment's judge (the search world's
    ``research``, ``answer``, ``plan``); a stage without criteria keeps the environment's
    own score."""
    template: str | None = None
    """Over ``{task}``, ``{response}`` and ``{criterion}`` (None: the judge's default)."""
    answers: tuple[str, str] = (" yes", " no")
    """The judge's yes and no, whose first tokens are compared (quote them in YAML:
    ``answers: [' yes', ' no']``; a bare yes is a boolean there)."""


class EnvConfig(_Strict):
    """A text environment for multi-turn agents (``rlpost.llm.data.envs``; ``rlpost.llm.rollout.agents``
    rolls it out token-in / token-out): each training prompt is an episode's seed, each
    group ``rollout.group_size`` episodes of one seed, the reward the environment's."""

    name: str
    params: dict[str, Any] = {}
    max_turns: int = Field(8, ge=1)
    """Turns per episode at most (an environment may end sooner, e.g. at its budget)."""
    workers: int = Field(1, ge=1)
    """Threads that step the episodes' environments concurrently (slow tools overlap)."""
    chat: bool = False
    """Episodes in the model's chat template (``rlpost.llm.rollout.chat``): observations as user /
    tool messages, actions as assistant turns, tool calls in the Hermes / Qwen format for
    environments with tools. The template is checked for being append-only at start."""
    system: str | None = None
    """A system message for chat episodes."""
    turn_signal: Literal["env", "ig", "rubric"] = "env"
    """Each turn's own signal (``Input.TURNS``' per-turn values, A²TGPO's): ``env``, the
    environment's ``info["gain"]`` (else the step reward); ``ig``, the information gain,
    the change in the policy's probability of the environment's ``ground_truth()``;
    ``rubric``, the environment's judge (``judge(info) -> (stage, score)``): each turn's
    score against its stage's rubric, with the stages (RubricEM's Stage-Structured GRPO)."""
    judge: WordJudgeConfig | None = None
    """With ``turn_signal: rubric``, the turns' scores from a judge model reading criteria
    in words (the stages stay the environment's); None: the environment's own rubric."""

    @model_validator(mode="after")
    def _exists(self) -> EnvConfig:
        from rlpost.llm.data.envs import make_env

        try:
            env = make_env(self.name, **self.params)
        except TypeError as exc:
            raise ValueError(f"data.env.params: {exc}") from None
        if self.turn_signal == "ig" and not hasattr(env, "ground_truth"):
            raise ValueError(
                f"data.env.turn_signal=ig: environment {self.name!r} has no ground truth "
                "to measure information gain on (use turn_signal=env)"
            )
        if self.turn_signal == "rubric" and not hasattr(env, "judge"):
            raise ValueError(
                f"data.env.turn_signal=rubric: environment {self.name!r} has no rubric judge "
                "(judge(info) -> (stage, score)); the search environment has one"
            )
        if self.judge is not None:
            self._check_judge(env)
        return self

    def _check_judge(self, env: Any) -> None:
        if self.turn_signal != "rubric":
            raise ValueError("data.env.judge (rubrics in words) needs data.env.turn_signal=rubric")
        stages = tuple(getattr(env, "STAGES", ()))
        unknown = [k for k in self.judge.criteria if k not in stages]
        if unknown:
            raise ValueError(
                f"data.env.judge.criteria: unknown stage {unknown[0]!r}; environment "
                f"{self.name!r} has {', '.join(stages) or 'no named stages'}"
            )
        empty = [k for k, v in self.judge.criteria.items() if not v]
        if empty:
            raise ValueError(f"data.env.judge.criteria: stage {empty[0]!r} has no criteria")


class DataConfig(_Strict):
    task: TaskName = "arithmetic"
    task_params: dict[str, Any] = {}
    path: str | None = None
    """Local JSONL / parquet with a "prompt" column (text, or a list of chat messages
    rendered with the tokenizer's chat template) and an "answer" column for the "correct"
    reward (math-verify; a prompt-only file needs your own ``reward.funcs``); other columns
    reach the verifiers in ``example.meta``. Overrides ``task`` for the training prompts."""
    eval_size: int = Field(256, ge=1)
    """Held-out rows (the last ones of a file); a smaller file holds out a tenth of it."""
    max_row_mb: float = Field(64.0, gt=0)
    """The largest row of a JSONL ``path``: a file is checked row by row before it is
    loaded (each problem named with its line), and a longer row is refused, so memory
    stays bounded."""
    seed: int = 0
    curriculum: list[TaskStage] = []
    """A sequence of tasks trained one after the other (continual post-training, e.g. with
    the ``cpo`` regulariser): stage ``i`` runs ``steps`` steps on its task; held-out
    accuracy is logged for every task of the sequence (``eval/<i>-<task>/accuracy``)."""
    mixture: list[MixtureDomain] = []
    """Several task domains at once (multi-domain RL, MOPD): each prompt is drawn from a
    domain with probability proportional to its weight and carries the domain's name in
    ``example.meta["domain"]`` (what ``distill.teachers[].domains`` route by); each is
    scored by its own verifier and held out separately (``eval/<task>/accuracy``)."""
    transfer: list[TransferTask] = []
    """Tasks never trained on whose held-out greedy accuracy is logged at every evaluation
    (``eval/transfer/<task>/accuracy``, each by its own verifier): what training on this
    data teaches elsewhere (GRLO's transfer from conversation to reasoning)."""
    env: EnvConfig | None = None
    """A multi-turn text environment instead of single-turn prompts: episodes of
    ``rollout.max_new_tokens`` tokens per turn, rewarded by the environment, held-out
    success on ``eval_size`` seeds never trained on (``eval/accuracy``)."""

    @model_validator(mode="after")
    def _check_curriculum(self) -> DataConfig:
        if self.env is not None and (self.curriculum or self.mixture or self.path is not None):
            raise ValueError("data.env excludes data.curriculum, data.mixture and data.path")
        if self.curriculum and self.path is not None:
            raise ValueError("data.curriculum and data.path are exclusive")
        if self.mixture and (self.curriculum or self.path is not None):
            raise ValueError("data.mixture excludes data.curriculum and data.path")
        names = [d.task for d in self.mixture]
        if len(set(names)) != len(names):
            raise ValueError(f"data.mixture: duplicate domains {names}")
        from rlpost.llm.data.tasks import check_task_params

        if self.path is None and self.env is None and not (self.curriculum or self.mixture):
            check_task_params(self.task, self.task_params, "data.task_params")
        for i, d in enumerate([*self.curriculum, *self.mixture]):
            kind = "curriculum" if i < len(self.curriculum) else "mixture"
            check_task_params(d.task, d.task_params, f"data.{kind}[{d.task}].task_params")
        for d in self.transfer:
            check_task_params(d.task, d.task_params, f"data.transfer[{d.task}].task_params")
        return self

    def describe(self) -> str:
        """What the run trains on, in a few words (plot titles): the file's name, the
        environment, the mixture's or curriculum's tasks, else the task."""
        from pathlib import Path

        if self.path is not None:
            return Path(self.path).name
        if self.env is not None:
            return f"env {self.env.name}"
        parts = self.mixture or self.curriculum
        return " + ".join(d.task for d in parts) if parts else self.task


class AuxDataConfig(_Strict):
    """Supervised examples (prompt + reference answer) of an auxiliary data set: GAC's SFT
    data, Dr. Post-Training's general data."""

    task: TaskName = "arithmetic"
    task_params: dict[str, Any] = {}
    path: str | None = None  # JSONL / parquet with "prompt" and "answer" columns
    seed: int = 1


SWITCHES = (
    Switch.declare(
        "data.path",
        lambda cfg: cfg.data.path is not None,
        breaks={
            Property.VERIFIER_FEEDBACK: "has no verifier feedback (use data.task or data.mixture)"
        },
        example=["data.path=prompts.jsonl"],
    ),
    Switch.declare(
        "data.curriculum",
        lambda cfg: bool(cfg.data.curriculum),
        breaks={Property.SINGLE_TASK: "switches tasks during the run"},
        example=["data.curriculum=[{task: arithmetic, steps: 1}, {task: countdown, steps: 1}]"],
    ),
    Switch.declare(
        "data.mixture",
        lambda cfg: bool(cfg.data.mixture),
        breaks={Property.SINGLE_TASK: "draws prompts from several task domains"},
        example=["data.mixture=[{task: arithmetic}, {task: countdown}]"],
    ),
)
