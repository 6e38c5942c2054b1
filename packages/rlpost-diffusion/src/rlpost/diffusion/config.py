"""Typed, validated configuration of a diffusion post-training run.

``load_config(yaml_path, overrides)`` merges the defaults below, a YAML recipe and
``key.sub=value`` overrides (OmegaConf dot-lists), then validates with pydantic: unknown
keys, wrong types and out-of-range values fail at load time naming the dotted field.

Method defaults (``algo.method``), each overridable:

=============  =========  =================  ========  ==============================
method         sampler    advantage          KL coef   trained denoising steps
=============  =========  =================  ========  ==============================
flow_grpo      flow_grpo  group mean / std   0.04      all
dance_grpo     dance      group mean / std   0         random 60 %, shared init noise
slas           dance      SLAS (batch norm)  0         random 60 %, shared init noise
ram            ode        group mean / std   (m)       K re-noisings of the endpoint
awm            ode        group mean / std   0         K re-noisings of the endpoint
rwr            ode        B softmax(r / T)   0         K re-noisings of the endpoint
=============  =========  =================  ========  ==============================
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlpost.core.io.config import ConfigError, load_validated

__all__ = ["Config", "ConfigError", "load_config"]

Method = Literal["flow_grpo", "dance_grpo", "slas", "ram", "awm", "rwr"]
SDE_METHODS = ("flow_grpo", "dance_grpo", "slas")
VELOCITY_METHODS = ("ram", "awm", "rwr")
METHOD_SAMPLER = {
    "flow_grpo": "flow_grpo",
    "dance_grpo": "dance",
    "slas": "dance",
    "ram": "ode",
    "awm": "ode",
    "rwr": "ode",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoraConfig(_Strict):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)


class ModelConfig(_Strict):
    name: Literal["digits", "digits-random", "sd3"] = "digits"
    """"digits": the embedded class-conditional model pretrained on scikit-learn's digits
    (built and cached on first use); "digits-random": untrained (tests); "sd3": a
    Stable Diffusion 3 checkpoint at ``path`` (local folder or hub id) with LoRA."""
    path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig | None = None
    """LoRA adapters (reference = adapters disabled); None: full fine-tuning with a frozen
    copy as reference. SD3 defaults to LoRA."""
    guidance_scale: float = Field(1.0, ge=1.0)
    resolution: int | None = Field(None, ge=8)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.name == "sd3" and not self.path:
            raise ValueError("model.path: required for model.name=sd3 (a local folder or hub id)")
        return self


class RewardConfig(_Strict):
    name: str = "geneval"
    """A built-in reward (``geneval``, ``pickscore``, ``hackable`` for the digits model) or
    ``package.module:callable`` returning a reward ``(images, prompts) -> [B]``."""


class PromptConfig(_Strict):
    prompts: list[int | str] = list(range(10))
    """Class ids for the digits model, text prompts for SD3."""
    per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)


class SamplerConfig(_Strict):
    steps: int = Field(10, ge=1)
    """Denoising steps of training rollouts (SDE methods) and endpoint samples (RAM...)."""
    eval_steps: int = Field(20, ge=1)
    shift: float = Field(1.0, gt=0)
    a: float = Field(0.7, gt=0)
    """Flow-GRPO noise level: s = a sqrt(sigma / (1 - sigma))."""
    eta: float = Field(0.3, gt=0)
    """DanceGRPO noise level."""


class NormGuardConfig(_Strict):
    coef: float = Field(0.0, ge=0)
    """Weight of the penalty; 0 disables NormGuard."""
    form: Literal["hinge", "squared_hinge", "relative"] = "hinge"
    margin: float = Field(0.0, ge=0)


class AlgoConfig(_Strict):
    method: Method = "flow_grpo"
    clip_range: float = Field(1e-4, gt=0)
    """PPO clip range of the per-step ratio (Flow-GRPO / DanceGRPO: 1e-4)."""
    adv_clip: float | None = Field(5.0, gt=0)
    kl_coef: float | None = Field(None, ge=0)
    """KL on the step means (SDE methods) or on the velocity (AWM / RWR); None: the
    method's default (0.04 for flow_grpo, else 0)."""
    timestep_fraction: float | None = Field(None, gt=0, le=1)
    """Fraction of denoising steps trained per sample; None: 1 for flow_grpo, 0.6 for
    dance_grpo / slas."""
    shared_noise: bool | None = None
    """Same initial noise for a prompt's group (DanceGRPO); None: the method's default."""
    slas_gamma: float = Field(0.5, ge=0)
    ram_m: float = Field(30.0, gt=0)
    """RAM strength m (1 / KL weight)."""
    renoise_k: int = Field(4, ge=1)
    """Velocity-local methods: re-noisings of each clean endpoint per step."""
    sigma_dist: Literal["logit_normal", "uniform"] = "logit_normal"
    sigma_loc: float = 0.0
    sigma_scale: float = Field(1.0, gt=0)
    rwr_temperature: float = Field(0.1, gt=0)
    normguard: NormGuardConfig = NormGuardConfig()

    def resolved_kl(self) -> float:
        if self.kl_coef is not None:
            return self.kl_coef
        return 0.04 if self.method == "flow_grpo" else 0.0

    def resolved_fraction(self) -> float:
        if self.timestep_fraction is not None:
            return self.timestep_fraction
        return 1.0 if self.method == "flow_grpo" else 0.6

    def resolved_shared_noise(self) -> bool:
        if self.shared_noise is not None:
            return self.shared_noise
        return self.method in ("dance_grpo", "slas")


class OptimConfig(_Strict):
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)
    micro_batch_size: int = Field(256, ge=1)
    minibatches: int = Field(1, ge=1)
    """Optimizer steps per sampled batch (the batch is split); > 1 makes later updates
    off-policy, which the PPO clip then bounds."""


class TrainConfig(_Strict):
    steps: int = Field(100, ge=1)


class RunConfig(_Strict):
    dir: str = "runs/diffusion"
    seed: int = 0
    eval_every: int = Field(10, ge=0)
    eval_per_prompt: int = Field(8, ge=1)
    save_every: int = Field(50, ge=0)
    keep_checkpoints: int = Field(2, ge=1)
    progress: bool = True
    threads: int | None = Field(None, ge=1)
    tensorboard: bool = True
    device: str = "auto"


class Config(_Strict):
    model: ModelConfig = ModelConfig()
    reward: RewardConfig = RewardConfig()
    prompts: PromptConfig = PromptConfig()
    sampler: SamplerConfig = SamplerConfig()
    algo: AlgoConfig = AlgoConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.prompts.prompts:
            raise ValueError("prompts.prompts: at least one prompt is needed")
        if self.model.name.startswith("digits"):
            bad = [p for p in self.prompts.prompts if str(p) not in {str(i) for i in range(10)}]
            if bad:
                raise ValueError(f"prompts.prompts: the digits model takes classes 0-9, got {bad}")
        return self

    @property
    def sampler_kind(self) -> str:
        return METHOD_SAMPLER[self.algo.method]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(Config, path, overrides)
