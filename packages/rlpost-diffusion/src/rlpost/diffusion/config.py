"""Typed, validated configuration of a diffusion post-training run.

``load_config(yaml_path, overrides)`` merges the defaults below, a YAML recipe and
``key.sub=value`` overrides (OmegaConf dot-lists), then validates with pydantic: unknown
keys, wrong types and out-of-range values fail at load time naming the dotted field.

``algo.method`` names an entry of :data:`rlpost.diffusion.methods.METHODS`, which fixes
its sampler, its advantage (a core ``ADVANTAGES`` entry), its loss and the defaults of the
trainer's knobs; ``algo.params`` are the method's own parameters and ``algo.advantage``
overrides its advantage, both validated against the registries at load.
``rlpost-diffusion methods`` prints the table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.io import schema
from rlpost.core.io.config import ConfigError, import_object, load_validated
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.presets import Choice
from rlpost.core.registry import RegistryError
from rlpost.diffusion.methods import METHODS, BoundMethod

__all__ = ["Config", "ConfigError", "load_config"]


class LoraConfig(schema.LoraConfig):
    """LoRA adapters on the velocity network (rank, alpha, dropout)."""


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
        local = self.path is not None and self.path.startswith(("/", ".", "~"))  # not a hub id
        if local and not Path(self.path).expanduser().is_dir():
            raise ValueError(f"model.path: no folder {self.path!r}")
        return self


class RewardConfig(_Strict):
    name: str = "geneval"
    """A built-in reward (``geneval``, ``pickscore``, ``hackable`` for the digits model),
    ``package.module:callable`` returning a reward ``(images, prompts) -> [B]`` (checked,
    imported, when the config loads), or a reward server's address (``http://host:port/``,
    flow_grpo's protocol: :mod:`rlpost.diffusion.reward_server`), called once per batch
    within ``timeout_s``."""
    server_key: str = "scores"
    """A reward server's answer: the key holding one score per image."""
    server_fields: dict[str, Any] = {}
    """A reward server's request: fields sent beside ``images``, ``prompts`` and
    ``queries`` (e.g. ``{only_strict: false}``)."""
    workers: int | None = Field(None, ge=0)
    """Worker processes scoring one image per item with time and memory limits (the
    :class:`rlpost.core.pool.RewardPool` the LLM trainer uses); 0: in this process, batched
    (a reward model on the GPU). None: 0 for a built-in reward, 2 for an imported one."""
    timeout_s: float = Field(30.0, gt=0)
    """Wall-clock limit of one image's score (workers > 0), or of a reward server's call."""
    memory_mb: float | None = Field(1024.0, gt=0)
    """Memory one score may allocate in its worker (workers > 0); None: no cap."""

    @model_validator(mode="after")
    def _check_name(self) -> RewardConfig:
        from rlpost.diffusion.rewards import REWARDS

        if self.is_server:
            return self
        if ":" in self.name:
            import_object(self.name, "reward.name")
        elif self.name not in REWARDS:
            raise ValueError(
                f"reward.name: unknown reward {self.name!r}; built-in: {sorted(REWARDS)}, "
                "or 'package.module:function'"
            )
        return self

    @property
    def is_server(self) -> bool:
        return self.name.startswith(("http://", "https://"))

    def resolved_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return 2 if ":" in self.name and not self.is_server else 0  # (a server: one call)

    def load(self) -> Any:
        """The reward this section names (:func:`rlpost.diffusion.rewards.load_reward`)."""
        if self.is_server:
            from rlpost.diffusion.reward_server import RemoteReward

            return RemoteReward(self.name, self.timeout_s, self.server_key, self.server_fields)
        from rlpost.diffusion.rewards import load_reward

        return load_reward(self.name)


class PromptConfig(_Strict):
    prompts: list[int | str] = list(range(10))
    """Class ids for the digits model, text prompts for SD3."""
    path: str | None = None
    """A prompt file replacing ``prompts``: ``.txt`` (one prompt per line; blank lines and
    ``#`` comments skipped), ``.jsonl`` (a ``prompt`` field per row) or ``.json`` (a list)."""
    per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _read_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("path") is not None:
            data = {**data, "prompts": read_prompt_file(data["path"])}
        return data


MAX_PROMPT_FILE_MB = 256


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a ``.txt``, ``.jsonl`` or ``.json`` file (see ``prompts.path``)."""
    import json

    from rlpost.core.io.rows import json_rows, text_lines

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"path: no prompt file {p}")
    if p.stat().st_size > MAX_PROMPT_FILE_MB << 20:
        raise ValueError(f"path: {p} is over {MAX_PROMPT_FILE_MB} MiB: not a prompt file")
    field = "prompts.path"  # each line read on its own, bounded; problems named by line
    try:
        if p.suffix == ".jsonl":
            prompts = [r["prompt"] for r in json_rows(p, field=field)]
        elif p.suffix == ".json":
            prompts = json.loads("".join(t for _, t in text_lines(p, field=field)))
        else:
            prompts = [ln.strip() for _, ln in text_lines(p, field=field)]
            prompts = [ln for ln in prompts if ln and not ln.startswith("#")]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"path: {p} is not a prompt file of its kind ({exc})") from None
    if not isinstance(prompts, list) or not all(isinstance(x, str | int) for x in prompts):
        raise ValueError(f"path: {p} must hold a list of prompts (strings)")
    if not prompts:
        raise ValueError(f"path: {p} holds no prompt")
    return [str(x) for x in prompts]


class SamplerConfig(_Strict):
    steps: int = Field(10, ge=1)
    """Denoising steps of training rollouts (SDE methods) and endpoint samples (RAM...)."""
    eval_steps: int = Field(20, ge=1)
    shift: float = Field(1.0, gt=0)
    params: dict[str, Any] = {}
    """The method's sampler's own parameters, merged over the method's (``a`` of
    ``flow_grpo``: s = a sqrt(sigma / (1 - sigma)); ``eta`` of ``dance``), validated
    against that sampler (``rlpost-diffusion methods`` lists each method's sampler)."""


class NormGuardConfig(_Strict):
    coef: float = Field(0.0, ge=0)
    """Weight of the penalty; 0 disables NormGuard."""
    form: Literal["hinge", "squared_hinge", "relative"] = "hinge"
    margin: float = Field(0.0, ge=0)


class AdvantageConfig(_Strict):
    """Overrides of the method's advantage: ``name`` (a core ``ADVANTAGES`` entry; None
    keeps the method's) and ``params`` merged over the method's (same entry) or alone."""

    name: str | None = None
    params: dict[str, Any] = {}


class AlgoConfig(_Strict):
    method: str = "flow_grpo"
    """A :data:`rlpost.diffusion.methods.METHODS` entry."""
    params: dict[str, Any] = {}
    """The method's own parameters (e.g. ``clip_range`` of the SDE methods, ``m`` of RAM)."""
    advantage: AdvantageConfig = AdvantageConfig()
    kl_coef: float | None = Field(None, ge=0)
    """KL on the step means (SDE methods) or on the velocity (velocity methods); None: the
    method's default."""
    family: dict[str, Any] = {}
    """The method's training family's own parameters, merged over the method's and
    validated against that family: ``timestep_fraction`` (``sde_replay``: the share of
    denoising steps trained per sample), ``renoise_k``, ``sigma_dist``, ``sigma_loc``,
    ``sigma_scale`` (``renoise``: re-noisings of each clean endpoint per step and their
    noise-level distribution). An older config's flat ``algo.<knob>`` is read into it."""
    shared_noise: bool | None = None
    """Same initial noise for a prompt's group (DanceGRPO); None: the method's default."""
    normguard: NormGuardConfig = NormGuardConfig()

    @model_validator(mode="before")
    @classmethod
    def _legacy_family_knobs(cls, data: Any) -> Any:
        """``algo.renoise_k`` / ``sigma_*`` / ``timestep_fraction`` (before families took
        typed parameters): moved into ``family`` when the method's family has them, else
        dropped (they never applied to it)."""
        knobs = ("timestep_fraction", "renoise_k", "sigma_dist", "sigma_loc", "sigma_scale")
        if not isinstance(data, dict) or not any(k in data for k in knobs):
            return data
        from rlpost.diffusion.families import FAMILIES

        data = dict(data)
        legacy = {k: data.pop(k) for k in knobs if k in data}
        method = data.get("method", "flow_grpo")
        if method in METHODS:
            fam = FAMILIES.get(METHODS.get(method).family.name)
            names = {f.name for f in dataclasses.fields(fam.params)}
            ok = {k: v for k, v in legacy.items() if k in names and v is not None}
            data["family"] = {**dict(data.get("family") or {}), **ok}
        return data

    @model_validator(mode="after")
    def _check_method(self) -> AlgoConfig:
        try:
            METHODS.get(self.method)
        except RegistryError as exc:
            raise ValueError(f"algo.method: {exc}") from exc
        try:
            self.bound_method()
        except RegistryError as exc:
            raise ValueError(f"algo.params / algo.advantage: {exc}") from exc
        try:
            self.family_params()
        except RegistryError as exc:
            raise ValueError(f"algo.family: {exc}") from exc
        return self

    def bound_method(self) -> BoundMethod:
        """The method with its validated parameters and (overridden) advantage."""
        m = METHODS.get(self.method)
        adv = m.advantage
        ov = self.advantage
        if ov.name is not None and ov.name != adv.name:
            adv = Choice(ov.name, dict(ov.params))
        elif ov.params:
            adv = Choice(adv.name, {**adv.params, **ov.params})
        return METHODS.build(self.method, self.params, adv)

    def resolved_kl(self) -> float:
        m = METHODS.get(self.method)
        if not m.kl_term:
            return 0.0
        return self.kl_coef if self.kl_coef is not None else m.kl_coef

    def regularizers(self) -> list[Choice]:
        """The method's regularisers with the run's KL coefficient and NormGuard: the
        active ones (``coef > 0``), KL first."""
        m = METHODS.get(self.method)
        out = [r for r in m.regularizers if r.name not in ("kl", "normguard")]
        kl = self.resolved_kl()
        if kl > 0:
            listed = next((r.params for r in m.regularizers if r.name == "kl"), {})
            out.insert(0, Choice("kl", {**listed, "coef": kl}))
        if self.normguard.coef > 0:
            out.append(Choice("normguard", self.normguard.model_dump()))
        return out

    def family_params(self) -> Any:
        """The training family's validated parameters: ``family`` over the method's."""
        from rlpost.diffusion.families import FAMILIES

        choice = METHODS.get(self.method).family
        return FAMILIES.params(choice.name, {**choice.params, **self.family})

    def resolved_shared_noise(self) -> bool:
        if self.shared_noise is not None:
            return self.shared_noise
        return METHODS.get(self.method).shared_noise


class OptimConfig(schema.OptimConfig):
    micro_batch_size: int = Field(256, ge=1)
    minibatches: int = Field(1, ge=1)
    """Optimizer steps per sampled batch (the batch is split); > 1 makes later updates
    off-policy, which the PPO clip then bounds."""


class TrainConfig(_Strict):
    steps: int = Field(100, ge=1)
    guard: schema.GuardConfig = schema.GuardConfig()
    """Non-finite steps (rewards, loss, gradients, parameters): skipped or rolled back and
    reported; ``max_consecutive`` in a row stop the run with a message."""


class RunConfig(schema.DeviceRunConfig):
    dir: str = "runs/diffusion"
    eval_per_prompt: int = Field(8, ge=1)
    save_every: int = Field(50, ge=0)


class Config(_Strict):
    model: ModelConfig = ModelConfig()
    reward: RewardConfig = RewardConfig()
    prompts: PromptConfig = PromptConfig()
    sampler: SamplerConfig = SamplerConfig()
    algo: AlgoConfig = AlgoConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="before")
    @classmethod
    def _legacy_sampler_knobs(cls, data: Any) -> Any:
        """``sampler.a`` / ``sampler.eta`` (before samplers took typed ``params``): moved
        into ``sampler.params`` when the method's sampler has them, else dropped (they
        never applied to it), so an old run's config loads and behaves as it did."""
        if not isinstance(data, dict) or not isinstance(data.get("sampler"), dict):
            return data
        sampler = dict(data["sampler"])
        legacy = {k: sampler.pop(k) for k in ("a", "eta") if k in sampler}
        if not legacy:
            return data
        from rlpost.diffusion.samplers import SAMPLERS

        algo = data.get("algo") or {}
        method = algo.get("method", "flow_grpo") if isinstance(algo, dict) else "flow_grpo"
        if method in METHODS:
            names = {f.name for f in dataclasses.fields(SAMPLERS.get(
                METHODS.get(method).sampler.name).params)}  # fmt: skip
            params = dict(sampler.get("params") or {})
            sampler["params"] = {**params, **{k: v for k, v in legacy.items() if k in names}}
        return {**data, "sampler": sampler}

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.prompts.prompts:
            raise ValueError("prompts.prompts: at least one prompt is needed")
        if self.model.name.startswith("digits"):
            bad = [p for p in self.prompts.prompts if str(p) not in {str(i) for i in range(10)}]
            if bad:
                raise ValueError(f"prompts.prompts: the digits model takes classes 0-9, got {bad}")
        try:
            self.sampler_params()
        except RegistryError as exc:
            raise ValueError(f"sampler.params: {exc}") from exc
        return self

    @property
    def sampler_kind(self) -> str:
        """The method's sampler (a :data:`rlpost.diffusion.samplers.SAMPLERS` entry)."""
        return METHODS.get(self.algo.method).sampler.name

    def sampler_params(self) -> Any:
        """The sampler's validated parameters: ``sampler.params`` over the method's."""
        from rlpost.diffusion.samplers import SAMPLERS

        choice = METHODS.get(self.algo.method).sampler
        return SAMPLERS.params(choice.name, {**choice.params, **self.sampler.params})


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(Config, path, overrides)
