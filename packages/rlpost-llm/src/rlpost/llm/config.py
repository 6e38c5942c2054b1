"""Typed, validated configuration of an LLM post-training run.

``load_config(yaml_path, overrides)`` merges, in order: the defaults below, a YAML recipe,
and ``key.sub=value`` overrides (OmegaConf dot-lists), then validates the result with
pydantic. Unknown keys, wrong types and out-of-range values fail at load time with the
dotted field name and, for choices, the allowed values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Coupling, Input
from rlpost.core.distill import DistillSchedule
from rlpost.core.feedback import FeedbackExploration
from rlpost.core.io import schema
from rlpost.core.io.config import ConfigError, import_object, load_validated
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.optim import OPTIMIZERS
from rlpost.core.presets import Choice, Preset, get_preset
from rlpost.core.registry import RegistryError
from rlpost.core.regularizers import REGULARIZERS
from rlpost.core.weights import TOKEN_WEIGHTINGS

__all__ = ["Config", "ConfigError", "load_config"]


class LoraConfig(schema.LoraConfig):
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelConfig(_Strict):
    path: str = "tiny"
    """"tiny": the embedded default pretrained on the task (built and cached on first use);
    "tiny-bpe": the same built with a BPE tokenizer and a Llama (another model family);
    "tiny-feedback": the same, half its pre-training problems shown after a wrong attempt's
    verifier feedback (a base that can read feedback, for FBOS-RL);
    "tiny-reflect": "tiny-feedback" with a quarter of its problems replaced by failed
    attempts and the lesson of their diagnosis (a base that can also write one, for
    RubricEM's reflection meta-policy);
    with ``data.env``, "tiny" is that environment's base (SFT on its demonstrations);
    "tiny-random": the character architecture, untrained (tests); else a local path or hub
    id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig | None = None
    logprob_impl: Literal["auto", "fused", "logits"] = "auto"
    """How log-probs / entropy are computed from the model: ``fused`` (decoder hidden states
    + LM-head weight through rlpost.kernels, no [B, L, V] logits), ``logits`` (the model's
    logits, chunked), ``auto`` (fused when the head is a plain linear layer)."""
    pack_prompts: bool = True
    """Pack the responses of a micro-batch that share a prompt into one sequence per prompt
    (``[prompt; r_1; ...; r_N]`` with a 4D attention mask, rlpost.kernels shared_prompt):
    the prompt is processed once instead of N times. Needs a model that accepts 4D masks."""
    pack_layout: Literal["ragged", "uniform"] = "ragged"
    """``ragged``: each response keeps only its own tokens and several groups share a packed
    row (no padding computed), attention through the model's own implementation with the
    4D mask; ``uniform``: every response padded to the longest, one group per row, attention
    through the shared-prompt op (Triton on CUDA)."""


TaskName = Literal["arithmetic", "countdown", "knapsack", "pde"]


class TaskStage(_Strict):
    """One task of a continual sequence (``data.curriculum``)."""

    task: TaskName
    task_params: dict[str, Any] = {}
    steps: int = Field(ge=1)


class MixtureDomain(_Strict):
    """One domain of a multi-domain prompt mixture (``data.mixture``)."""

    task: TaskName
    task_params: dict[str, Any] = {}
    weight: float = Field(1.0, gt=0)
    reward: bool = True
    """False: the domain's prompts earn no verifier reward (they are only distilled, as a
    CoPD expert's peers' domains are); its accuracy still counts in the metrics."""


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
        return self


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
        return self


class AuxDataConfig(_Strict):
    """Supervised examples (prompt + reference answer) of an auxiliary data set: GAC's SFT
    data, Dr. Post-Training's general data."""

    task: TaskName = "arithmetic"
    task_params: dict[str, Any] = {}
    path: str | None = None  # JSONL / parquet with "prompt" and "answer" columns
    seed: int = 1


class SpeculativeConfig(_Strict):
    draft: int | str = 1
    """An int: a self-speculative early-exit draft of the policy's first that many layers
    (shares its weights, so it follows every update); a str: the local path or hub id of a
    causal LM on the same tokenizer (frozen)."""
    k: int = Field(4, ge=1)
    """Draft tokens proposed per round."""


class KVCompressionConfig(_Strict):
    """Rollouts under a compressed KV cache (001-13): each generated token attends to the
    row's first ``sink`` tokens and its last ``window`` ones (rlpost.llm.rollout.engines.
    kv_compressed; the prompt's prefill stays dense)."""

    sink: int = Field(4, ge=0)
    window: int = Field(64, ge=1)
    correction: Literal["shadow", "none"] = "shadow"
    """``shadow``: the learner computes every log-prob under the sampler's own attention
    pattern (the shadow mask), so the update is on-policy for the policy that sampled, with
    no importance weights, and ``distill`` pulls the dense-context policy towards it;
    ``none``: the learner scores with the full context as if nothing were compressed (the
    biased baseline; ``algo.correction: tis`` adds importance reweighting to it)."""
    distill: float = Field(0.0, ge=0)
    """Weight of the distillation of the compressed-context (shadow) policy towards the
    full-context one: ``0.5 (log pi_shadow(y) - sg log pi_dense(y))^2`` per sampled token,
    token-mean; 0 in value and gradient when the two views agree (no compression). Off by
    default: at 0.1 it did not help on tools/bench_kv_compressed.py."""


class RolloutConfig(_Strict):
    engine: Literal["auto", "lean", "hf", "vllm"] = "auto"
    """``lean``: rlpost's decode loop (one prefill per prompt, static KV cache,
    rlpost.llm.rollout.engines.lean); ``hf``: transformers ``generate``; ``vllm``: vLLM (GPU);
    ``auto``: lean when the model's architecture is one it runs, else hf."""
    group_size: int | None = Field(None, ge=1)  # None: the preset's
    prompts_per_step: int = Field(16, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    stop: list[str] = []
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    workers: int = Field(0, ge=0)
    """Ray rollout workers (rlpost.llm.rollout.engines.ray_workers): that many engine actors, each
    with its own copy of the policy, generate a step's prompts in shards; weights go
    through Ray's object store after each update; a dead worker is replaced and its shard
    regenerated. 0: generate in this process."""
    ray_address: str | None = None
    """The Ray cluster the workers join (``ray.init(address=...)``); None: the cluster
    this process already joined, else a local Ray with ``workers`` CPUs."""
    speculative: SpeculativeConfig | None = None
    """Lossless speculative decoding (001-27): rollouts from the policy's exact
    distribution, a draft model proposing tokens the policy verifies in one forward
    (rlpost.llm.rollout.engines.speculative; replaces the in-process engine)."""
    kv_compression: KVCompressionConfig | None = None
    """Rollouts under a sink + window compressed KV cache, and the learner's correction
    (001-13; replaces the in-process engine)."""


class ChoiceConfig(_Strict):
    name: str
    params: dict[str, Any] = {}


class CriticConfig(_Strict):
    """The value model, built when the recipe needs critic values (``gae``: PPO, SAO)."""

    model: str = "policy"
    """"policy": a copy of the policy's decoder (its weights at the start); else a local
    path or hub id of a causal LM whose decoder carries the value head."""
    lora: LoraConfig | None = None
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip: float | None = Field(0.2, gt=0)
    """PPO value clipping: V stays within +-clip of the values the advantages used."""
    grad_clip: float | None = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start during which only the critic trains (the policy is not updated)."""


class RegularizerConfig(_Strict):
    """A gradient regulariser (``rlpost.core.regularizers.REGULARIZERS``: gac,
    dr_post_training, cpo) applied to every policy update."""

    name: str
    params: dict[str, Any] = {}
    data: AuxDataConfig | None = None
    """The auxiliary data set for entries that need auxiliary gradients (GAC's SFT data,
    Dr. Post-Training's general data)."""
    batches: int = Field(4, ge=1)
    """M: auxiliary batches (one gradient each) per update."""
    batch_size: int = Field(16, ge=1)


# the inputs of the method/trainer contract (rlpost.core.contract) this trainer computes
# for any recipe that reads them; provided_inputs adds those that depend on the config
PROVIDES = frozenset(
    {
        Input.MASK,
        Input.VALUES,  # the critic (built when an entry needs values; `critic` section)
        Input.TOKEN_DISTS,  # top-K of the behaviour policy and the current one (algo.topk)
        Input.BEHAVIOUR_LOGPROBS,  # the engine's log-probs of the sampled tokens
        Input.PROMPT_FEATURES,  # mean-pooled last hidden state over the prompt
        Input.COMPLETION_FEATURES,  # ... over the completion
        Input.DYNAMICS,  # progress, sampled-token entropy estimate and its first value
        Input.ROLLOUT_LOGPROBS,
        Input.REF_LOGPROBS,
        Input.REF_ENTROPY,  # the reference forward's per-position entropy
        Input.ENTROPY,
        Input.GROUP_IDS,
        Input.CLIP_RANGE,  # whatever the advantage estimator returns
        Input.GRAD_SAMPLES,  # per-micro-batch gradients (with >= 2 micro-batches)
        Input.PARAMETERS,
        Input.GENERATION_BUDGET,  # rollout.max_new_tokens
    }
)


# how to make the trainer provide the inputs that depend on the config
HINTS = {
    Input.VECTOR_REWARDS: "set two or more reward.funcs, e.g. reward.funcs='[{name: "
    "correct}, {name: format}]'",
    Input.AUX_GRADIENTS: "set regularizer.data (the auxiliary data set)",
    Input.TASK_BOUNDARY: "set data.curriculum (a sequence of tasks)",
    Input.TEACHER_LOGPROBS: "set distill.teachers, e.g. distill.teachers='[{path: tiny}]'",
    Input.TEACHER_TOPK: "set distill.teachers, e.g. distill.teachers='[{path: tiny}]'",
    Input.TEACHER_FULL: "set distill.teachers, e.g. distill.teachers='[{path: tiny}]'",
}


def provided_inputs(cfg: Config) -> frozenset[Input]:
    """What the GRPO-family trainer provides under ``cfg``: :data:`PROVIDES`, vector rewards
    with two or more ``reward.funcs``, auxiliary gradients with ``regularizer.data``, task
    boundaries with ``data.curriculum``."""
    extra = set()
    if len(cfg.reward.funcs) >= 2:
        extra.add(Input.VECTOR_REWARDS)
    if cfg.regularizer is not None and cfg.regularizer.data is not None:
        extra.add(Input.AUX_GRADIENTS)
    if cfg.data.curriculum:
        extra.add(Input.TASK_BOUNDARY)
    if cfg.data.env is not None:
        extra.add(Input.TURNS)
    if cfg.distill.teachers or cfg.copd is not None:  # (CoPD: the peers) log-probs, top-K, ...
        extra |= {
            Input.TEACHER_LOGPROBS,
            Input.TEACHER_TOPK,
            Input.TEACHER_FULL,
            Input.TEACHER_SPANS,
        }
    return PROVIDES | extra


class AlgoConfig(_Strict):
    preset: str = "grpo"
    advantage: ChoiceConfig | None = None
    ratio: ChoiceConfig | None = None
    correction: ChoiceConfig | None = None
    objective: ChoiceConfig | None = None
    aggregation: ChoiceConfig | None = None
    kl: ChoiceConfig | None = None
    kl_coef: float | None = Field(None, ge=0)
    entropy_coef: float | None = None
    dynamic_sampling: bool | None = None
    stages: int | None = Field(None, ge=1)
    """Mu-GRPO's large generation-optimisation stages (None: the preset's)."""
    validation_reset: bool | None = None
    """REVA-PO's VAPR (None: the preset's)."""
    token_weights: ChoiceConfig | None = None
    """Per-token loss weights from attention entropy (catalog 001-08): an
    ``rlpost.core.weights.TOKEN_WEIGHTINGS`` entry (anchors, explorers, random_subset,
    dynamic); the maps come from an extra no-grad forward with eager attention."""
    topk: int = Field(16, ge=1)
    """K of the per-token top-K distributions for entries that read them
    (``predictive_divergence_mask``)."""
    distill: ChoiceConfig | None = None
    """The distillation estimator (``rlpost.core.distill.DISTILL_ESTIMATORS``: full, topk,
    sampled; None: the preset's)."""
    distill_rows: Literal["all", "correct", "incorrect"] | None = None
    """Which responses are distilled (OPSD's filters; None: the preset's)."""
    distill_schedule: dict[str, Any] | None = None
    """The weights of the distillation and RL terms over training
    (``rlpost.core.distill.DistillSchedule`` fields, e.g. ``{kind: anneal, horizon: 0.5}``;
    None: the preset's)."""

    feedback: dict[str, Any] | None = None
    """FBOS-RL's guided round (``rlpost.core.feedback.FeedbackExploration`` fields: share,
    epa, ecc, template, reflector, reflect_template, meta; merged over the preset's;
    None: the preset's)."""

    def build_preset(self, group_size: int | None = None) -> Preset:
        p = get_preset(self.preset)
        changes: dict[str, Any] = {}
        for key in ("advantage", "ratio", "correction", "objective", "aggregation", "kl"):
            c = getattr(self, key)
            if c is not None:
                changes[key] = Choice(c.name, dict(c.params))
        if self.distill is not None:
            changes["distill"] = Choice(self.distill.name, dict(self.distill.params))
        if self.distill_schedule is not None:
            base = dataclasses.asdict(p.distill_schedule)
            changes["distill_schedule"] = DistillSchedule(**{**base, **self.distill_schedule})
        if self.feedback is not None:
            if p.feedback is None:
                raise ValueError(
                    f"algo.feedback: preset {p.name!r} has no feedback-guided round (use "
                    "fbos, fbos_epa, fbos_ecc or rubricem_reflect)"
                )
            changes["feedback"] = FeedbackExploration(
                **{**dataclasses.asdict(p.feedback), **self.feedback}
            )
        keys = ("kl_coef", "entropy_coef", "dynamic_sampling", "stages", "validation_reset")
        for key in (*keys, "distill_rows"):
            if getattr(self, key) is not None:
                changes[key] = getattr(self, key)
        if group_size is not None:
            changes["group_size"] = group_size
        p = p.replace(**changes)
        p.build()
        return p


class OptimConfig(schema.OptimConfig):
    name: str = "adamw"
    """An ``rlpost.core.optim.OPTIMIZERS`` entry: ``adamw``, ``muon`` or ``pion`` (the matrix
    optimisers update hidden-layer matrices at ``params.matrix_lr`` and the embeddings,
    head, norms and biases with AdamW at ``lr``)."""
    params: dict[str, Any] = {}
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW's (also the matrix optimisers' AdamW part)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    updates_per_batch: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check_optimizer(self) -> OptimConfig:
        try:
            self.entry_params()
        except RegistryError as exc:
            raise ValueError(f"optim: {exc}") from exc
        return self

    def entry_params(self) -> dict[str, Any]:
        """The validated parameters of the ``OPTIMIZERS`` entry (``betas`` from here unless
        ``params`` sets them)."""
        params = {"betas": tuple(self.betas), **self.params}
        OPTIMIZERS.build(self.name, **params)
        return params


class MipuConfig(_Strict):
    """MIPU (004-26): each update is a candidate, its ratios referenced to the sampler's
    own log-probs; it is synchronised to the rollout engine and kept only if the engine's
    log-probs of the batch say the inference policy improved (``rlpost.core.mipu``:
    ``gain - penalty * kl >= min_gain``); a rejected candidate leaves the weights, the
    optimiser and the schedule as they were."""

    penalty: float = Field(0.0, ge=0)
    """Weight of the inference-side KL(mu || mu') subtracted from the surrogate gain."""
    min_gain: float = 0.0


class TrainConfig(_Strict):
    steps: int = Field(50, ge=1)
    overlong_mask: bool = True
    """Exclude responses cut by max_new_tokens from the loss (they still count in advantages)."""
    max_refill: int = Field(3, ge=0)
    """Dynamic sampling: extra generation rounds to refill dropped zero-variance groups."""
    async_rollouts: bool = False
    """One-step-off: generate step t+1's rollouts while training on step t's (the same as
    ``pipeline: one_step_off``)."""
    pipeline: Literal["sync", "one_step_off", "dora", "bubblespec", "rolloutpipe"] = "sync"
    """How generation and training overlap. ``sync``: generate, then train. ``one_step_off``:
    step t+1's batch is generated on a weight snapshot while step t trains. ``dora``
    (DORA's multi-version streaming, 001-29): a generator streams chunks of
    ``stream_prompts`` groups without pause, each chunk wholly from one weights version
    (new weights load between chunks); a step trains on the next ``prompts_per_step``
    groups in arrival order, so its rows may come from several versions, and groups more
    than ``max_staleness`` versions old are dropped (``dora/dropped_groups``).
    ``bubblespec`` (BubbleSpec, 001-05): while step t trains, a weight snapshot generates
    rollouts of step t+1's prompts; at step t+1 they serve as drafts that the updated policy
    verifies (``draft_k`` tokens a forward), so the rollouts stay exactly on-policy.
    ``rolloutpipe`` (RolloutPipe, 004-30): a step's groups are generated at its fixed
    weights in chunks of ``stream_prompts`` complete groups, the groups the batch needs
    first, and each chunk is back-propagated as soon as it is scored while later ones
    generate; one optimiser step at the end, equal to the synchronous update."""
    draft_k: int = Field(4, ge=1)
    """BubbleSpec: draft tokens verified per target forward."""
    stream_prompts: int | None = Field(None, ge=1)
    """DORA and RolloutPipe: prompts (groups) per generation chunk; None: a quarter of a
    step's."""
    max_staleness: int = Field(1, ge=0)
    mipu: MipuConfig | None = None
    """Accept an update only if the inference policy improves (MIPU, 004-26)."""
    max_minutes: float | None = Field(None, gt=0)
    """A wall-clock budget: the run ends after the first step past it (its last step is
    evaluated and saved like a final one); None: run all ``steps``."""
    guard: schema.GuardConfig = schema.GuardConfig()
    """Non-finite steps: skipped or rolled back, and too many in a row stop the run."""
    parallel: Literal["ddp", "fsdp2"] = "ddp"
    """Several processes (``torchrun``): ``ddp`` replicates the weights and all-reduces the
    gradients; ``fsdp2`` shards weights, gradients and optimiser state over the ranks
    (``torch.distributed.fsdp.fully_shard``), gathering whole weights only for the rollout
    engine and checkpoints. One process: no difference."""

    @model_validator(mode="before")
    @classmethod
    def _pipeline(cls, data: Any) -> Any:
        """``async_rollouts`` and ``pipeline: one_step_off`` say the same thing."""
        if not isinstance(data, dict):
            return data
        a, pipe = data.get("async_rollouts", False), data.get("pipeline", "sync")
        if a in (True, "true", "True") and pipe not in ("sync", "one_step_off"):
            raise ValueError(f"train.async_rollouts is the one_step_off pipeline, not {pipe}")
        if a in (True, "true", "True"):
            pipe = "one_step_off"
        return {**data, "pipeline": pipe, "async_rollouts": pipe == "one_step_off"}

    @property
    def overlapped(self) -> bool:
        """Generation runs beside training (on a snapshot of the weights)."""
        return self.pipeline != "sync"


class RewardFunction(_Strict):
    name: str
    """"correct": the task's verifier (math-verify for ``data.path`` files); "format": a
    well-formed answer (non-empty, answer characters only); else "package.module:function"
    or "path/to/file.py:function" with the signature ``fn(completion: str, example) ->
    float`` or TRL's ``fn(prompts, completions, **kwargs) -> list[float | None]`` (module
    level, picklable)."""
    weight: float = 1.0

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data  # funcs=[a:f, b:g]


class RewardConfig(_Strict):
    workers: int = Field(2, ge=0)
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: float | None = Field(1024.0, gt=0)
    """How much memory one evaluation may allocate in its worker (``RLIMIT_AS`` above the
    worker's size when ready); past it the item scores 0 (``reward/oom``). None: no cap."""
    funcs: list[RewardFunction] = [RewardFunction(name="correct")]
    weights: list[float] | None = None
    """TRL's ``reward_weights``: one weight per function of ``funcs`` (replacing theirs)."""
    """The reward functions (TRL's ``reward_funcs`` / ``reward_weights``): the scalar reward
    is their weighted sum; estimators of vector rewards (vpo, rdpo) get the components.
    Each is logged (``reward/<name>/mean``); accuracy is the "correct" component."""

    @model_validator(mode="after")
    def _check_funcs(self) -> RewardConfig:
        names = [f.name for f in self.funcs]
        if not names:
            raise ValueError("reward.funcs: at least one reward function")
        default = names == ["correct"]  # (weights may then be for Trainer(reward_funcs=))
        if not default and self.weights is not None and len(self.weights) != len(names):
            raise ValueError(
                f"reward.weights: {len(self.weights)} weights for {len(names)} reward.funcs"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"reward.funcs: duplicate names {names}")
        for n in names:
            if n not in ("correct", "format") and ":" not in n:
                raise ValueError(
                    f"reward.funcs: unknown reward {n!r}; use 'correct', 'format' or "
                    "'package.module:function'"
                )
            if ":" in n:  # imported now: a bad name fails at load, not after the model
                import_object(n, "reward.funcs")
        return self

    def weight_of(self) -> dict[str, float]:
        """Each function's weight (``weights`` when given, else each entry's)."""
        if self.weights is not None:
            if len(self.weights) != len(self.funcs):
                raise ValueError(
                    f"reward.weights: {len(self.weights)} weights for {len(self.funcs)} "
                    "reward.funcs"
                )
            return {f.name: w for f, w in zip(self.funcs, self.weights, strict=True)}
        return {f.name: f.weight for f in self.funcs}


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


class CoPDConfig(_Strict):
    """Co-evolving policy distillation (catalog 001-26; ``rlpost.llm.runtimes.copd``): one expert per
    domain of ``data.mixture``, trained in parallel as Ray actors. Each expert runs RLVR on
    its own domain and on-policy distillation from the other experts on theirs; after every
    round the experts exchange weights (bidirectional OPD); at the end they are
    consolidated into one model."""

    experts: list[str] = []
    """The domains that get an expert (empty: every domain of ``data.mixture``)."""
    rounds: int = Field(5, ge=1)
    """Weight exchanges: each expert trains ``train.steps / rounds`` steps per round against
    the peers' weights of the round's start."""
    consolidate: Literal["mopd", "average", "none"] = "mopd"
    """``mopd``: distil the final experts into one student from ``model.path`` (each
    prompt to its domain's expert); ``average``: the experts' mean weights; ``none``."""
    consolidate_steps: int = Field(50, ge=1)
    workers: int = Field(0, ge=0)
    """CPUs Ray may use (0: one per expert)."""


class FederatedConfig(_Strict):
    """Federated post-training (catalog 001-07; ``rlpost.llm.runtimes.federated``): clients train
    locally on their own prompt streams and send compressed updates to the server."""

    clients: int = Field(4, ge=1)
    rounds: int = Field(10, ge=1)
    """Updates per client (each after ``local_steps`` steps from the weights it received)."""
    local_steps: int = Field(1, ge=1)
    compression: Literal["topk", "int8", "none"] = "topk"
    ratio: float = Field(0.1, gt=0, le=1)
    """top-k: the fraction of entries each update keeps (the rest wait in error feedback)."""
    staleness: float = Field(0.5, ge=0)
    """a of the asynchronous discount (1 + s)^-a of an update s server versions old."""
    backend: Literal["ray", "local"] = "ray"
    """``ray``: clients as Ray actors, updates applied as they arrive (asynchronous);
    ``local``: clients one after another in this process, synchronous FedAvg rounds."""
    workers: int = Field(0, ge=0)
    """CPUs Ray may use (0: one per client)."""
    eval_every: int = Field(0, ge=0)
    """Evaluate the server every this many rounds' worth of updates (``clients`` updates
    each; 0: before and after only): the summary's learning ``curve``."""


class MutualPolicyConfig(_Strict):
    """One policy of a Mutual RL run: its own weights (and so tokenizer), preset and
    learning rate; everything else is the run's config."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    path: str = "tiny"
    """``model.path`` of this policy: "tiny" (the character Qwen2 base), "tiny-bpe" (the
    BPE Llama base of the same task), a run directory's checkpoint folder, or a hub id."""
    preset: str | None = None
    """None: ``algo.preset``. A preset without peer sharing gives its experience to its
    peers and takes none (a control)."""
    lr: float | None = Field(None, gt=0)
    cpus: int = Field(1, ge=1)
    """Ray CPUs (and torch threads) of this policy's actor: Mutual RL's multi-worker
    resource allocation."""


class MutualConfig(_Strict):
    """Mutual RL (catalog 001-11; ``rlpost.llm.runtimes.mutual``): heterogeneous policies, each a
    Ray actor with its own parameters, objective and tokenizer, answer the same prompts
    every step and exchange their typed experience (prompt, response text, token-level
    log-probs with character offsets, reward) through a Ray actor; each uses its peers'
    responses as its preset's ``peers`` says (prp, xgrpo, sgt)."""

    policies: list[MutualPolicyConfig] = Field(min_length=2)
    backend: Literal["ray", "local"] = "ray"
    """``ray``: each policy a Ray actor, the exchange a Ray actor (local Ray, or the
    cluster ``ray.init`` connects to); ``local``: the policies in threads of this process
    (no Ray; they share its CPUs)."""
    member: str | None = None
    """Set by ``rlpost.llm.runtimes.mutual`` in each policy's own config: the policy it trains."""

    @model_validator(mode="after")
    def _names(self) -> MutualConfig:
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"mutual.policies: names must be unique, got {names}")
        if self.member is not None and self.member not in names:
            raise ValueError(f"mutual.member {self.member!r} is not among {names}")
        return self


class RunConfig(schema.CheckpointedRunConfig):
    dir: str = "runs/llm"


class TrainRunConfig(RunConfig, schema.DeviceRunConfig):
    """The RL trainer's run settings: :class:`RunConfig` and the device. The policy (and
    its reference copy and critic) live there, rollouts run on the model's device, and
    the trainer's per-token bookkeeping (advantages, masks, the policy loss) stays on the
    host."""


class Config(_Strict):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    reward: RewardConfig = RewardConfig()
    critic: CriticConfig = CriticConfig()
    regularizer: RegularizerConfig | None = None
    distill: DistillConfig = DistillConfig()
    copd: CoPDConfig | None = None
    federated: FederatedConfig | None = None
    mutual: MutualConfig | None = None
    run: TrainRunConfig = TrainRunConfig()

    @model_validator(mode="after")
    def _check_algo(self) -> Config:
        try:
            self.preset()
        except (RegistryError, ValueError, TypeError) as exc:
            raise ValueError(f"algo: {exc}") from exc
        preset = self.preset()
        recipe = preset.build()
        recipe.check(
            provided_inputs(self), who="the rlpost-llm trainer with this config", hints=HINTS
        )
        n = preset.group_size  # the rollout's, else the preset's
        pure = preset.distill is not None and preset.distill_schedule.rl_free
        if n == 1 and recipe.advantage_coupling() == Coupling.GROUP and not pure:
            raise ValueError(
                f"rollout.group_size=1: the {recipe.advantage} compares the responses "
                "to one prompt, so with one response each every advantage is 0 and nothing "
                "trains; use rollout.group_size >= 2 (or an estimator with a critic or a "
                "cross-prompt baseline)"
            )
        rows = self.rollout.prompts_per_step * n
        if preset.feedback is not None:  # FBOS-RL: up to m EPA copies per prompt on top
            extra = preset.feedback.split(n)[1] * (2 if preset.feedback.meta else 1)
            rows += self.rollout.prompts_per_step * extra  # (and m reflections, RubricEM)
        coupling = recipe.coupling()
        who = ", ".join(str(e) for e in recipe.loss_entries() if e.coupling == coupling)
        if coupling == Coupling.BATCH and self.optim.micro_batch_size < rows:
            raise ValueError(
                f"{who} reads a statistic of the whole step batch: "
                f"optim.micro_batch_size ({self.optim.micro_batch_size}) must hold all "
                f"{rows} rows (rollout.prompts_per_step x rollout.group_size)"
            )
        if coupling == Coupling.GROUP and self.optim.micro_batch_size % n:
            raise ValueError(
                f"{who} couples the responses of a group: "
                f"optim.micro_batch_size ({self.optim.micro_batch_size}) must be a multiple "
                f"of rollout.group_size ({n})"
            )
        self._check_options(preset, rows)
        if self.data.env is not None and preset.dynamic_sampling:
            raise ValueError("data.env: dynamic sampling (refilling groups) is not supported")
        if self.train.mipu is not None:
            for bad, why in (
                (self.rollout.workers > 0, "rollout.workers"),
                (self.rollout.engine == "vllm", "the vllm engine"),
                (self.train.overlapped, f"train.pipeline {self.train.pipeline}"),
                (preset.stages > 1, "Mu-GRPO stages"),
            ):
                if bad:
                    raise ValueError(
                        f"train.mipu: scores the candidate on an in-process engine right "
                        f"after its update, which {why} does not allow"
                    )
        if self.rollout.workers and self.rollout.engine == "vllm":
            raise ValueError("rollout.workers: Ray workers run the lean or hf engine (not vllm)")
        if self.rollout.workers and self.rollout.speculative is not None:
            raise ValueError("rollout.workers and rollout.speculative: not together yet")
        spec = self.rollout.speculative
        if spec is not None and self.rollout.engine == "vllm":
            raise ValueError("rollout.speculative: in-process engines only (not vllm)")
        if spec is not None and isinstance(spec.draft, int) and self.model.lora is not None:
            raise ValueError(
                "rollout.speculative.draft: an early-exit draft needs full weights, not "
                "model.lora (give a draft model's path instead)"
            )
        if self.train.overlapped and self.rollout.engine == "vllm":
            raise ValueError(f"train.pipeline {self.train.pipeline}: hf engine only")
        if self.train.pipeline == "bubblespec":
            for bad, why in (
                (self.data.env is not None, "data.env (multi-turn episodes)"),
                (preset.feedback is not None, f"preset {preset.name!r}'s feedback rounds"),
                (preset.dynamic_sampling, f"preset {preset.name!r}'s refill rounds"),
                (self.mutual is not None, "mutual"),
                (self.rollout.workers > 0, "rollout.workers"),
                (self.rollout.speculative is not None, "rollout.speculative (its own drafts)"),
                (self.data.curriculum or self.data.mixture, "a curriculum or mixture"),
            ):
                if bad:
                    raise ValueError(f"train.pipeline bubblespec: not with {why}")
        if self.train.pipeline == "dora":
            for bad, why in (
                (self.data.env is not None, "data.env (multi-turn episodes)"),
                (preset.feedback is not None, f"preset {preset.name!r}'s feedback rounds"),
                (self.mutual is not None, "mutual"),
            ):
                if bad:
                    raise ValueError(f"train.pipeline dora: streams plain groups, not {why}")
        if self.train.pipeline == "rolloutpipe":
            self._check_rolloutpipe(preset, recipe)
        if self.train.parallel == "fsdp2":
            for bad, why in (
                (self.model.lora is not None, "model.lora"),
                (Input.VALUES in recipe.reads(), "a critic"),
                (self.algo.token_weights is not None, "algo.token_weights"),
                (
                    bool({Input.PROMPT_FEATURES, Input.COMPLETION_FEATURES} & set(recipe.reads())),
                    "prompt / completion features",
                ),
                (bool(self.distill.teachers), "distill.teachers"),
                (self.train.mipu is not None, "train.mipu"),
                (self.regularizer is not None, "a gradient regularizer"),
                (self.rollout.kv_compression is not None, "rollout.kv_compression"),
                (self.rollout.speculative is not None, "rollout.speculative"),
                (self.rollout.workers > 0, "rollout.workers"),
                (self.rollout.engine == "vllm", "the vllm engine"),
                (self.train.pipeline != "sync", f"train.pipeline {self.train.pipeline}"),
                (preset.stages > 1, "Mu-GRPO stages"),
                (preset.validation_reset, "validation resets (REVA-PO)"),
                (self.data.env is not None, "data.env"),
            ):
                if bad:
                    raise ValueError(f"train.parallel fsdp2: not with {why} yet")
        if self.rollout.kv_compression is not None:
            for bad, why in (
                (self.rollout.engine == "vllm", "the vllm engine"),
                (self.rollout.workers > 0, "rollout.workers"),
                (self.rollout.speculative is not None, "rollout.speculative"),
                (self.train.pipeline in ("bubblespec", "rolloutpipe"), self.train.pipeline),
                (self.data.env is not None, "data.env (multi-turn episodes)"),
            ):
                if bad:
                    raise ValueError(f"rollout.kv_compression: not with {why}")
        return self

    def _check_rolloutpipe(self, preset: Preset, recipe: Any) -> None:
        """RolloutPipe back-propagates each chunk of complete groups before the rest of the
        step exists: whatever reads more of the batch than a group cannot be pipelined."""
        whole = [
            str(e)
            for e in (recipe.advantage, *recipe.loss_entries())
            if e.coupling == Coupling.BATCH
        ]
        for bad, why in (
            (bool(whole), f"{', '.join(whole)} (reads the whole step batch)"),
            (Input.DYNAMICS in recipe.reads(), "an entry reading the batch's entropy (dynamics)"),
            (Input.VALUES in recipe.reads(), "a critic (its loss is normalised by the batch)"),
            (self.optim.updates_per_batch > 1, "optim.updates_per_batch > 1"),
            (self.algo.token_weights is not None, "algo.token_weights"),
            (self.regularizer is not None, "a gradient regularizer"),
            (self.distill.memory is not None, "distill.memory"),
            (self.data.env is not None, "data.env (multi-turn episodes)"),
            (preset.feedback is not None, f"preset {preset.name!r}'s feedback rounds"),
            (preset.peers is not None or self.mutual is not None, "peers (mutual)"),
        ):
            if bad:
                raise ValueError(
                    f"train.pipeline rolloutpipe: trains each complete group as it arrives, "
                    f"so not with {why}"
                )

    def _check_options(self, preset: Preset, rows: int) -> None:
        """Token weightings, the regulariser and the schedules against this trainer."""
        have = provided_inputs(self)
        mbs = self.optim.micro_batch_size
        for where, reg, c in (
            ("algo.token_weights", TOKEN_WEIGHTINGS, self.algo.token_weights),
            ("regularizer", REGULARIZERS, self.regularizer),
        ):
            if c is None:
                continue
            try:
                bound = reg.build(c.name, **dict(c.params))
            except RegistryError as exc:
                raise ValueError(f"{where}: {exc}") from exc
            lacking = sorted(bound.needs - have)
            if lacking:
                raise ValueError(
                    f"{where}: {bound} needs {', '.join(lacking)}: "
                    + "; ".join(HINTS.get(i, "not provided by this trainer") for i in lacking)
                )
            if Input.GRAD_SAMPLES in bound.needs and mbs >= rows:
                raise ValueError(
                    f"{where}: {bound} needs per-micro-batch gradient samples: "
                    f"optim.micro_batch_size ({mbs}) must be below the {rows} rows of a step"
                )
        if preset.stages > 1 and self.train.overlapped:
            raise ValueError("algo.stages > 1 (Mu-GRPO) needs train.pipeline sync")
        if preset.validation_reset and not self.run.eval_every:
            raise ValueError("validation_reset (REVA-PO's VAPR) needs run.eval_every > 0")
        teacher_inputs = {Input.TEACHER_LOGPROBS, Input.TEACHER_TOPK, Input.TEACHER_FULL}
        if (
            self.distill.teachers
            and self.copd is None
            and not teacher_inputs & set(preset.build().reads())
        ):
            raise ValueError(
                f"distill.teachers is set but nothing in preset {preset.name!r} reads a "
                "teacher: use a distillation preset (opd, opd_rl, mopd, atod, opsd, sdpo), "
                "step_opsd, or set algo.distill"
            )
        domains = {d.task for d in self.data.mixture}
        multi = [k for k in ("copd", "federated", "mutual") if getattr(self, k) is not None]
        if len(multi) > 1:
            raise ValueError(f"{' and '.join(multi)} are exclusive")
        self._check_mutual(preset)
        self._check_feedback(preset)
        if self.copd is not None:
            experts = self.copd.experts or sorted(domains)
            if len(experts) < 2 or not set(experts) <= domains:
                raise ValueError(
                    f"copd: needs data.mixture with two or more domains and experts among "
                    f"them (experts {experts}, domains {sorted(domains) or 'none'})"
                )
            if preset.distill is None:
                raise ValueError(f"copd: preset {preset.name!r} has no distillation estimator")
            if self.train.steps % self.copd.rounds:
                raise ValueError(
                    f"copd: train.steps ({self.train.steps}) must be a multiple of copd.rounds "
                    f"({self.copd.rounds})"
                )
        mem = self.distill.memory
        if mem is not None:
            from rlpost.llm.methods.memory import FIELDS

            used = [
                f for t in self.distill.teachers for f in FIELDS[mem.kind]
                if t.template and "{" + f + "}" in t.template
            ]  # fmt: skip
            if not used:
                raise ValueError(
                    f"distill.memory ({mem.kind}): no distill.teachers[].template reads it; "
                    f"use {', '.join('{' + f + '}' for f in FIELDS[mem.kind])}"
                )
            if mem.reflector == "policy" and self.train.overlapped:
                raise ValueError(
                    "distill.memory.reflector=policy writes with the rollout engine: it needs "
                    "synchronous rollouts (train.pipeline=sync)"
                )
            if mem.reflector == "feedback" and self.data.path is not None:
                raise ValueError(
                    "distill.memory.reflector=feedback needs a built-in task's verifier "
                    "feedback (data.task or data.mixture); with data.path use reflector=policy"
                )
        for i, t in enumerate(self.distill.teachers):
            unknown = sorted(set(t.domains) - domains) if domains else sorted(t.domains)
            if unknown:
                raise ValueError(
                    f"distill.teachers[{i}].domains: {unknown} not among the data domains "
                    f"({', '.join(sorted(domains)) or 'none: set data.mixture'})"
                )

    def _check_feedback(self, preset: Preset) -> None:
        """FBOS-RL's guided round needs a built-in task's verifier feedback and
        synchronous, ungated groups."""
        if preset.feedback is None:
            return
        why = None
        if self.data.env is not None:
            why = "data.env (multi-turn episodes get their feedback as observations)"
        elif self.data.path is not None:
            why = "data.path (no verifier feedback; use data.task or data.mixture)"
        elif preset.dynamic_sampling:
            why = "dynamic sampling (the guided round is what rescues all-equal groups)"
        elif preset.stages > 1:
            why = "algo.stages > 1"
        elif any(getattr(self, k) is not None for k in ("mutual", "copd", "federated")):
            why = "mutual, copd or federated runs"
        elif preset.build().coupling() == Coupling.GROUP:
            why = "a loss that couples a group's rows (EPA makes groups uneven)"
        if why:
            raise ValueError(
                f"preset {preset.name!r} (feedback-guided re-rollouts) does not support {why}"
            )

    def _check_mutual(self, preset: Preset) -> None:
        m = self.mutual
        if m is None:
            if preset.peers is not None:
                raise ValueError(
                    f"preset {preset.name!r} trains beside peer policies ({preset.peers.mode} "
                    "sharing): set mutual.policies (see the mutual_arithmetic recipe)"
                )
            return
        if m.member is None:  # the run: every policy's preset must exist (a run where none
            for p in m.policies:  # shares is the control: the same schedule, no exchange)
                try:
                    pp = self.algo.model_copy(update={"preset": p.preset or self.algo.preset})
                    pp.build_preset(self.rollout.group_size)
                except (RegistryError, ValueError, TypeError) as exc:
                    raise ValueError(f"mutual.policies[{p.name}]: {exc}") from exc
        if self.train.overlapped or preset.stages > 1:
            raise ValueError("mutual: needs synchronous steps (train.pipeline sync, no stages)")

    def train_steps(self) -> int:
        """Total steps: the curriculum's when one is set, else ``train.steps``."""
        return sum(s.steps for s in self.data.curriculum) or self.train.steps

    def preset(self) -> Preset:
        return self.algo.build_preset(self.rollout.group_size)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(Config, path, overrides)
