"""Typed, validated configuration of an LLM post-training run.

``load_config(yaml_path, overrides)`` merges, in order: the defaults below, a YAML recipe,
and ``key.sub=value`` overrides (OmegaConf dot-lists), then validates the result with
pydantic. Unknown keys, wrong types and out-of-range values fail at load time with the
dotted field name and, for choices, the allowed values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlpost.core.contract import Coupling, Input
from rlpost.core.io.config import ConfigError, load_validated
from rlpost.core.presets import Choice, Preset, get_preset
from rlpost.core.registry import RegistryError

__all__ = ["Config", "ConfigError", "load_config"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraConfig(_Strict):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelConfig(_Strict):
    path: str = "tiny"
    """"tiny": the embedded default pretrained on the task (built and cached on first use);
    "tiny-random": the same architecture, untrained (tests); else a local path or hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig | None = None
    logprob_impl: Literal["auto", "fused", "logits"] = "auto"
    """How log-probs / entropy are computed from the model: ``fused`` (decoder hidden states
    + LM-head weight through rlpost.kernels, no [B, L, V] logits), ``logits`` (the model's
    logits, chunked), ``auto`` (fused when the head is a plain linear layer)."""
    pack_prompts: bool = False
    """Pack the responses of a micro-batch that share a prompt into one sequence per prompt
    (``[prompt; r_1; ...; r_N]`` with a 4D attention mask, rlpost.kernels shared_prompt):
    the prompt is processed once instead of N times. Needs a model that accepts 4D masks."""


class DataConfig(_Strict):
    task: Literal["arithmetic", "countdown"] = "arithmetic"
    task_params: dict[str, Any] = {}
    path: str | None = None
    """Local JSONL / parquet with "prompt" and "answer" columns (scored by math-verify);
    overrides ``task`` for the training prompts."""
    eval_size: int = Field(256, ge=1)
    seed: int = 0


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = "hf"
    group_size: int | None = Field(None, ge=1)  # None: the preset's
    prompts_per_step: int = Field(16, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    stop: list[str] = []
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)


class ChoiceConfig(_Strict):
    name: str
    params: dict[str, Any] = {}


# the inputs of the method/trainer contract (rlpost.core.contract) this trainer computes
# for any recipe that reads them
PROVIDES = frozenset(
    {
        Input.MASK,
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
    }
)


def provided_inputs(cfg: Config) -> frozenset[Input]:
    """What the GRPO-family trainer provides under ``cfg``."""
    return PROVIDES


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

    def build_preset(
        self, group_size: int | None = None, max_new_tokens: int | None = None
    ) -> Preset:
        p = get_preset(self.preset)
        changes: dict[str, Any] = {}
        for key in ("advantage", "ratio", "correction", "objective", "aggregation", "kl"):
            c = getattr(self, key)
            if c is not None:
                changes[key] = Choice(c.name, dict(c.params))
        for key in ("kl_coef", "entropy_coef", "dynamic_sampling"):
            if getattr(self, key) is not None:
                changes[key] = getattr(self, key)
        if group_size is not None:
            changes["group_size"] = group_size
        agg = changes.get("aggregation", p.aggregation)
        explicit = self.aggregation.params if self.aggregation else {}
        if agg.name == "constant" and "normalizer" not in explicit and max_new_tokens is not None:
            # Dr. GRPO: the constant normaliser is the generation budget
            changes["aggregation"] = Choice("constant", {"normalizer": float(max_new_tokens)})
        p = p.replace(**changes)
        p.build()
        return p


class OptimConfig(_Strict):
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_size: int = Field(64, ge=1)
    updates_per_batch: int = Field(1, ge=1)


class TrainConfig(_Strict):
    steps: int = Field(50, ge=1)
    overlong_mask: bool = True
    """Exclude responses cut by max_new_tokens from the loss (they still count in advantages)."""
    max_refill: int = Field(3, ge=0)
    """Dynamic sampling: extra generation rounds to refill dropped zero-variance groups."""
    async_rollouts: bool = False
    """One-step-off: generate step t+1's rollouts while training on step t's."""
    max_staleness: int = Field(1, ge=0)


class RewardConfig(_Strict):
    workers: int = Field(2, ge=0)
    timeout_s: float = Field(5.0, gt=0)


class RunConfig(_Strict):
    dir: str = "runs/llm"
    seed: int = 0
    eval_every: int = Field(10, ge=0)
    save_every: int = Field(10, ge=0)
    keep_checkpoints: int = Field(2, ge=1)
    progress: bool = True
    threads: int | None = Field(None, ge=1)
    tensorboard: bool = True


class Config(_Strict):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    reward: RewardConfig = RewardConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="after")
    def _check_algo(self) -> Config:
        try:
            self.preset()
        except (RegistryError, ValueError, TypeError) as exc:
            raise ValueError(f"algo: {exc}") from exc
        preset = self.preset()
        recipe = preset.build()
        recipe.check(provided_inputs(self), who="the rlpost-llm trainer with this config")
        n = preset.group_size  # the rollout's, else the preset's
        rows = self.rollout.prompts_per_step * n
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
        if self.train.async_rollouts and self.rollout.engine == "vllm":
            raise ValueError("train.async_rollouts: supported with the hf engine only")
        return self

    def preset(self) -> Preset:
        return self.algo.build_preset(self.rollout.group_size, self.rollout.max_new_tokens)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(Config, path, overrides)
