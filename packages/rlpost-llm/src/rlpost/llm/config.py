"""Typed, validated configuration of an LLM post-training run.

``load_config(yaml_path, overrides)`` merges, in order: the defaults, a YAML recipe, and
``key.sub=value`` overrides (OmegaConf dot-lists), then validates the result with
pydantic. Unknown keys, wrong types and out-of-range values fail at load time with the
dotted field name and, for choices, the allowed values.

Each section's class lives beside the code it configures (``model``:
:mod:`rlpost.llm.model.config`, ``data``: :mod:`rlpost.llm.data.config`, ``rollout`` /
``reward``: :mod:`rlpost.llm.rollout.config`, ``algo`` / ``optim`` / ``train`` /
``critic`` / ``regularizer`` / ``run``: :mod:`rlpost.llm.train.config`, ``distill``:
:mod:`rlpost.llm.methods.config`, ``copd`` / ``federated`` / ``mutual``:
:mod:`rlpost.llm.runtimes.config`). :class:`Config` composes them and checks the whole at
load: the recipe against the inputs the trainer's providers supply, how its couplings
split a step, each component's own requirements, and, in one generic check, that no
component the config switches on breaks what another requires
(:mod:`rlpost.llm.train.compat`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from rlpost.core.contract import Coupling
from rlpost.core.io.config import ConfigError, load_validated
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.presets import Preset
from rlpost.core.registry import RegistryError
from rlpost.core.regularizers import REGULARIZERS
from rlpost.core.weights import TOKEN_WEIGHTINGS
from rlpost.llm.data.config import (
    AuxDataConfig,
    DataConfig,
    EnvConfig,
    MixtureDomain,
    TaskName,
    TaskStage,
)
from rlpost.llm.methods.config import DistillConfig, MemoryConfig, TeacherConfig
from rlpost.llm.model.config import LoraConfig, ModelConfig
from rlpost.llm.rollout import sources
from rlpost.llm.rollout.config import (
    KVCompressionConfig,
    RewardConfig,
    RewardFunction,
    RolloutConfig,
    SpeculativeConfig,
)
from rlpost.llm.runtimes.config import (
    CoPDConfig,
    FederatedConfig,
    MutualConfig,
    MutualPolicyConfig,
)
from rlpost.llm.train import compat, hooks, providers
from rlpost.llm.train.config import (
    AlgoConfig,
    ChoiceConfig,
    CriticConfig,
    MipuConfig,
    OptimConfig,
    RegularizerConfig,
    RunConfig,
    TrainConfig,
    TrainRunConfig,
)

__all__ = [
    "AlgoConfig",
    "AuxDataConfig",
    "ChoiceConfig",
    "CoPDConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DistillConfig",
    "EnvConfig",
    "FederatedConfig",
    "KVCompressionConfig",
    "LoraConfig",
    "MemoryConfig",
    "MipuConfig",
    "MixtureDomain",
    "ModelConfig",
    "MutualConfig",
    "MutualPolicyConfig",
    "OptimConfig",
    "RegularizerConfig",
    "RewardConfig",
    "RewardFunction",
    "RolloutConfig",
    "RunConfig",
    "SpeculativeConfig",
    "TaskName",
    "TaskStage",
    "TeacherConfig",
    "TrainConfig",
    "TrainRunConfig",
    "load_config",
    "provided_inputs",
]


def provided_inputs(cfg: Config):
    """What the GRPO-family trainer provides under ``cfg``: the inputs of every input
    provider the config lets run (:mod:`rlpost.llm.train.providers`)."""
    return providers.provided_inputs(cfg)


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
    def _check(self) -> Config:
        try:
            preset = self.preset()
        except (RegistryError, ValueError, TypeError) as exc:
            raise ValueError(f"algo: {exc}") from exc
        recipe = preset.build()
        recipe.check(
            provided_inputs(self),
            who="the rlpost-llm trainer with this config",
            hints=providers.hints(),
        )
        self._check_choices()
        compat.check(self, preset, recipe)  # what cannot run together, before the rest
        self._check_groups(preset, recipe)
        sources.check(self, preset)
        providers.check(self, preset, recipe)
        hooks.check(self, preset, recipe)
        compat.run_checks(self, preset, recipe)
        return self

    def _check_groups(self, preset: Preset, recipe) -> None:
        """A group-relative estimator needs groups; a coupled loss needs micro-batches
        that hold what it couples."""
        n = preset.group_size  # the rollout's, else the preset's
        pure = preset.distill is not None and preset.distill_schedule.rl_free
        if n == 1 and recipe.advantage_coupling() == Coupling.GROUP and not pure:
            raise ValueError(
                f"rollout.group_size=1: the {recipe.advantage} compares the responses "
                "to one prompt, so with one response each every advantage is 0 and nothing "
                "trains; use rollout.group_size >= 2 (or an estimator with a critic or a "
                "cross-prompt baseline)"
            )
        rows = self.rollout.prompts_per_step * sources.rows_per_group(self, preset)
        coupling = recipe.coupling()
        who = ", ".join(str(e) for e in recipe.loss_entries() if e.coupling == coupling)
        mbs = self.optim.micro_batch_size
        if coupling == Coupling.BATCH and mbs < rows:
            raise ValueError(
                f"{who} reads a statistic of the whole step batch: "
                f"optim.micro_batch_size ({mbs}) must hold all "
                f"{rows} rows (rollout.prompts_per_step x rollout.group_size)"
            )
        if coupling == Coupling.GROUP and mbs % n:
            raise ValueError(
                f"{who} couples the responses of a group: "
                f"optim.micro_batch_size ({mbs}) must be a multiple "
                f"of rollout.group_size ({n})"
            )

    def _check_choices(self) -> None:
        """The token weighting and the regulariser exist and get what they need."""
        have = provided_inputs(self)
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
                hint = providers.hints()
                raise ValueError(
                    f"{where}: {bound} needs {', '.join(lacking)}: "
                    + "; ".join(hint.get(i, "not provided by this trainer") for i in lacking)
                )

    def train_steps(self) -> int:
        """Total steps: the curriculum's when one is set, else ``train.steps``."""
        return sum(s.steps for s in self.data.curriculum) or self.train.steps

    def preset(self) -> Preset:
        return self.algo.build_preset(self.rollout.group_size)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(Config, path, overrides)
