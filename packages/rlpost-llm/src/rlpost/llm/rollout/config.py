"""The rollout sections: the engine and its sampling (``rollout``; speculative and
compressed-KV rollouts) and the reward functions that score them (``reward``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import Declares, Party, Property, Switch
from rlpost.core.io.config import import_object
from rlpost.core.io.schema import Strict as _Strict


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

    @property
    def shadow(self) -> tuple[int, int] | None:
        """The learner's view of the sampler: its ``(sink, window)`` attention pattern
        under the shadow correction, else None (dense)."""
        return (self.sink, self.window) if self.correction == "shadow" else None


class RolloutConfig(_Strict):
    engine: Literal["auto", "lean", "hf", "vllm"] = "auto"
    """``lean``: rlpost's decode loop (one prefill per prompt, static KV cache,
    rlpost.llm.rollout.engines.lean); ``hf``: transformers ``generate``; ``vllm``: vLLM (GPU);
    ``auto``: lean when the model's architecture is one it runs, else hf."""
    lean_decode: Literal["auto", "dynamic", "static", "graph"] = "auto"
    """The lean engine's decode step (``LeanEngine(decode=...)``): ``dynamic`` (finished
    rows leave the batch), ``graph`` (CUDA: the step at fixed shapes as a CUDA graph),
    ``static`` (the same fixed-shape step run eagerly), ``auto``: graph on CUDA, else
    dynamic."""
    group_size: int | None = Field(None, ge=1)  # None: the preset's
    prompts_per_step: int = Field(16, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    """Tokens a rollout runs before EOS may end it (``generate``'s ``min_new_tokens``,
    vLLM's ``min_tokens``): EOS is masked out of the sampler until then, so the engine's
    log-probs are the masked distribution's. ``= max_new_tokens`` forces full-length
    responses (``tools/bench_llm_grpo.py --full-length``). 0: off. Evaluation is not
    affected."""
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

    @model_validator(mode="after")
    def _check_min_new_tokens(self) -> RolloutConfig:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"rollout.min_new_tokens ({self.min_new_tokens}) is above "
                f"rollout.max_new_tokens ({self.max_new_tokens})"
            )
        for name in ("speculative", "kv_compression"):
            if self.min_new_tokens and getattr(self, name) is not None:
                raise ValueError(
                    f"rollout.min_new_tokens: the rollout.{name} engine does not mask EOS; "
                    "leave it 0 there"
                )
        return self


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


class VerifierNoiseConfig(_Strict):
    """Controlled verifier noise (000-07): the verifier's binary verdict, as the training
    reward sees it, flipped at random: a wrong answer passes with probability
    ``false_positive``, a right one fails with probability ``false_negative``
    (:mod:`rlpost.llm.rollout.noise`). Accuracy and evaluation keep the true verdict."""

    false_positive: float = Field(0.0, ge=0, lt=1)
    false_negative: float = Field(0.0, ge=0, lt=1)
    seed: int = 0
    """The noise's own generator (checkpointed: a resumed run draws the same flips)."""


class RewardConfig(_Strict):
    workers: int = Field(2, ge=0)
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: float | None = Field(1024.0, gt=0)
    """How much memory one evaluation may allocate in its worker (``RLIMIT_AS`` above the
    worker's size when ready); past it the item scores 0 (``reward/oom``). None: no cap."""
    stop_after_failing: int | None = Field(3, ge=1)
    """Scoring rounds in a row on which one reward function fails on every completion
    (raises, times out or runs out of memory) before the run stops, in one line naming
    the function and its error (exit 2); null: never (failed evaluations score 0)."""
    funcs: list[RewardFunction] = [RewardFunction(name="correct")]
    weights: list[float] | None = None
    """TRL's ``reward_weights``: one weight per function of ``funcs`` (replacing theirs)."""
    """The reward functions (TRL's ``reward_funcs`` / ``reward_weights``): the scalar reward
    is their weighted sum; estimators of vector rewards (vpo, rdpo) get the components.
    Each is logged (``reward/<name>/mean``); accuracy is the "correct" component."""
    noise: VerifierNoiseConfig | None = None
    """Inject false positives / negatives into the verifier's verdict (000-07); None: off."""

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
            if ":" in n:  # imported and checked now: fails at load, not after the model
                from rlpost.llm.rollout.rewards import check_reward_signature

                check_reward_signature(import_object(n, "reward.funcs"), f"reward.funcs: {n}")
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


# -------------------------------------------------------------- what these sections switch on
_TORCH = "run on the trainer's torch weights (lean or hf engine, not vllm)"

#: what each ``rollout.engine`` declares
ENGINES = {
    "auto": Declares(),
    "lean": Declares(),
    "hf": Declares(),
    "vllm": Declares(
        requires={Property.UNSHARDED: "loads the merged whole weights"},
        breaks={Property.TORCH_ENGINE: "generates in vLLM, not on the trainer's torch weights"},
    ),
}


def parties(cfg: Any, preset: Any, recipe: Any) -> list[Party]:
    """The engine the config runs."""
    return [Party(f"the {cfg.rollout.engine} engine", ENGINES[cfg.rollout.engine])]


SWITCHES = (
    Switch.declare(
        "rollout.workers",
        lambda cfg: cfg.rollout.workers > 0,
        requires={
            Property.TORCH_ENGINE: "run the lean or hf engine (not vllm)",
            Property.STOCK_ENGINE: "run plain engines (not with rollout.speculative yet)",
            Property.UNSHARDED: "copy the whole weights to each worker",
        },
        breaks={
            Property.IN_PROCESS_ENGINE: "generate in Ray actors",
            Property.STOCK_ENGINE: "replace the in-process engine with Ray actors",
        },
        example=["rollout.workers=2"],
    ),
    Switch.declare(
        "rollout.speculative",
        lambda cfg: cfg.rollout.speculative is not None,
        requires={
            Property.TORCH_ENGINE: "drafts and verifies on in-process engines only (not vllm)",
            Property.STOCK_ENGINE: "drafts with a plain engine",
            Property.UNSHARDED: "verifies with the whole weights",
        },
        breaks={Property.STOCK_ENGINE: "replaces the engine with a draft-and-verify one"},
        example=["rollout.speculative={draft: 1}"],
    ),
    Switch.declare(
        "rollout.speculative's early-exit draft",
        lambda cfg: (
            cfg.rollout.speculative is not None and isinstance(cfg.rollout.speculative.draft, int)
        ),
        requires={Property.FULL_WEIGHTS: "needs full weights (give a draft model's path instead)"},
        example=["rollout.speculative={draft: 1}"],
    ),
    Switch.declare(
        "rollout.kv_compression",
        lambda cfg: cfg.rollout.kv_compression is not None,
        requires={
            Property.TORCH_ENGINE: _TORCH,
            Property.STOCK_ENGINE: "compresses a plain engine's cache",
            Property.SINGLE_TURN: "compresses single-turn rollouts",
            Property.WHOLE_BATCH: "normalises its correction by the step's tokens",
            Property.ONE_PROCESS: "shadows the sampler in one process",
            Property.UNSHARDED: "shadows with the whole weights",
        },
        breaks={Property.STOCK_ENGINE: "replaces the engine with a compressed-KV one"},
        example=["rollout.kv_compression={sink: 2}"],
    ),
)
