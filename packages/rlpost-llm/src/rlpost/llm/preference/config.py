"""Typed, validated configuration of a preference-optimisation run (``rlpost-llm dpo``).

``load_preference_config(yaml_path, overrides)`` merges the defaults below, a YAML recipe
and ``key.sub=value`` overrides (OmegaConf dot-lists) and validates the result with
pydantic, like :func:`rlpost.llm.config.load_config`. The loss is built through the
``rlpost.core.preference.PREFERENCE_LOSSES`` registry at load time, so an unknown name or
parameter fails before anything loads, naming the valid ones; what the entry declares it
needs is checked against what this trainer provides (:data:`PROVIDES`).

``loss.params`` are the chosen entry's parameters; a recipe ships its parameters for every
loss in ``loss.per_loss`` (a recipe's ``loss.params`` would survive a ``loss.name``
override, since OmegaConf merges dictionaries, and land on the wrong entry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlpost.core.contract import ContractError, Coupling, Input
from rlpost.core.io.config import ConfigError, load_validated
from rlpost.core.io.schema import GuardConfig
from rlpost.core.io.schema import Strict as _Strict
from rlpost.core.preference import PREFERENCE_LOSSES
from rlpost.core.registry import Bound, RegistryError
from rlpost.llm.model.config import ModelConfig
from rlpost.llm.rollout.config import RewardConfig
from rlpost.llm.train.config import OptimConfig, RunConfig

__all__ = [
    "PROVIDES",
    "ConfigError",
    "LossConfig",
    "OnlineConfig",
    "PreferenceConfig",
    "PreferenceDataConfig",
    "PreferenceTrainConfig",
    "load_preference_config",
]

#: The inputs of the method/trainer contract this trainer computes for any loss that
#: reads them: the reference policy's sequence log-probs and the response lengths.
PROVIDES = frozenset({Input.REF_LOGPROBS, Input.LENGTHS})


class PreferenceDataConfig(_Strict):
    task: Literal["arithmetic", "countdown"] = "arithmetic"
    """The built-in task: the source of the embedded default's pairs (chosen = the
    reference answer, rejected = a perturbed wrong answer), of the online prompts and of
    the held-out greedy accuracy; also the task the ``tiny`` model is built on."""
    task_params: dict[str, Any] = {}
    path: str | None = None
    """Local JSONL / parquet with TRL's columns ``prompt``, ``chosen``, ``rejected`` (plain
    strings); replaces the task's pairs. The last ``eval_size`` rows are held out."""
    max_row_mb: float = Field(64.0, gt=0)
    """The largest row of a JSONL ``path`` (checked row by row before loading)."""
    train_size: int = Field(2048, ge=1)
    """Training pairs built from the task (one per prompt; held-out prompts excluded)."""
    eval_size: int = Field(256, ge=1)
    eval_max_new_tokens: int = Field(6, ge=1)
    """Generation budget of the held-out greedy accuracy."""
    seed: int = 0


#: a parameter the trainer can set from the initial model (``"auto"``): xi-DPO's ``xi``
#: by ``xi_from_initial`` over the training pairs, as its abstract prescribes
AUTO_PARAMS = {"xi_dpo": "xi"}
_STAND_IN = 0.5  # an ``auto`` parameter's value while the config is validated


class LossConfig(_Strict):
    name: str = "dpo"
    """A ``PREFERENCE_LOSSES`` entry: dpo, ipo, simpo, xi_dpo, gate_dpo, ed_dpo."""
    params: dict[str, Any] = {}
    """The chosen entry's parameters (over ``per_loss[name]``)."""
    per_loss: dict[str, dict[str, Any]] = {}
    """Parameters a recipe ships for each loss name (every one validated at load). The
    entry is built with ``{**per_loss.get(name, {}), **params}``, so ``loss.name=simpo`` on
    the command line takes the recipe's SimPO parameters instead of carrying DPO's.
    ``xi_dpo: {xi: auto}`` sets xi from the initial model (:data:`AUTO_PARAMS`)."""

    @model_validator(mode="after")
    def _check_loss(self) -> LossConfig:
        try:
            for name, params in self.per_loss.items():
                PREFERENCE_LOSSES.build(name, **_stood_in(name, params))
            self.build()
        except RegistryError as exc:
            raise ValueError(str(exc)) from exc
        return self

    def resolved_params(self) -> dict[str, Any]:
        """The parameters the chosen entry is built with (an ``auto`` one as ``"auto"``)."""
        return {**self.per_loss.get(self.name, {}), **self.params}

    def auto_param(self) -> str | None:
        """The chosen entry's parameter given as ``"auto"``, else ``None``."""
        key = AUTO_PARAMS.get(self.name)
        return key if key is not None and self.resolved_params().get(key) == "auto" else None

    def build(self, **resolved: Any) -> Bound:
        """The validated registry entry (``.needs`` / ``.reads`` / ``.coupling``), with
        ``resolved`` values for ``auto`` parameters (a stand-in until they are known)."""
        params = {**_stood_in(self.name, self.resolved_params()), **resolved}
        return PREFERENCE_LOSSES.build(self.name, **params)


def _stood_in(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with an ``auto`` parameter of entry ``name`` replaced by a stand-in."""
    key = AUTO_PARAMS.get(name)
    return {**params, key: _STAND_IN} if key and params.get(key) == "auto" else params


class OnlineConfig(_Strict):
    """``mode: online``: pairs sampled from the current policy and ranked by the task's
    verifier every step (iterative DPO with ``refresh_reference``)."""

    pairs_per_step: int = Field(32, ge=1)
    samples_per_prompt: int = Field(4, ge=2)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(6, ge=1)
    max_refill: int = Field(3, ge=0)
    """Extra generation rounds (fresh prompts) when prompts without both a correct and a
    wrong sample left fewer than ``pairs_per_step`` pairs."""
    refresh_reference: bool = False
    """Iterative DPO: every ``round_steps`` steps the reference becomes the current policy."""
    round_steps: int = Field(10, ge=1)


class PreferenceTrainConfig(_Strict):
    steps: int = Field(100, ge=1)
    epochs: float | None = Field(None, gt=0)
    """Offline: train for this many passes over the training pairs (replaces ``steps``:
    ``ceil(epochs * pairs / batch_size)`` steps)."""
    batch_size: int = Field(64, ge=1)
    """Offline: pairs per optimizer step (``online.pairs_per_step`` online)."""
    guard: GuardConfig = GuardConfig()
    """Non-finite steps: skipped or rolled back, and too many in a row stop the run."""


class PreferenceConfig(_Strict):
    model: ModelConfig = ModelConfig()
    data: PreferenceDataConfig = PreferenceDataConfig()
    loss: LossConfig = LossConfig()
    mode: Literal["offline", "online"] = "offline"
    online: OnlineConfig = OnlineConfig()
    optim: OptimConfig = OptimConfig()
    train: PreferenceTrainConfig = PreferenceTrainConfig()
    reward: RewardConfig = RewardConfig()
    run: RunConfig = RunConfig(dir="runs/dpo")

    @model_validator(mode="after")
    def _check(self) -> PreferenceConfig:
        bound = self.loss.build()
        missing = sorted(str(i) for i in bound.needs - PROVIDES)
        if missing:
            raise ContractError(
                f"loss: {bound} needs {missing}, which this trainer does not provide"
            )
        if bound.coupling > Coupling.ROW and self.optim.micro_batch_size < self.batch_pairs():
            raise ValueError(
                f"loss: {bound} couples the pairs of a {bound.coupling}: "
                f"optim.micro_batch_size ({self.optim.micro_batch_size}) must hold all "
                f"{self.batch_pairs()} pairs of a step"
            )
        if self.mode == "online" and self.data.path is not None:
            raise ValueError(
                "mode: online ranks samples with the task's verifier; data.path gives fixed "
                "pairs (use mode=offline, or drop data.path)"
            )
        if self.mode == "online" and self.loss.auto_param() is not None:
            raise ValueError(
                f"loss: {self.loss.name}'s {self.loss.auto_param()}=auto is set from the "
                "initial model's training pairs, which mode=online does not have (give a value)"
            )
        if self.mode == "offline" and self.online.refresh_reference:
            raise ValueError("online.refresh_reference: needs mode=online (iterative rounds)")
        if self.mode == "online" and self.train.epochs is not None:
            raise ValueError("train.epochs: offline only (online pairs are fresh every step)")
        if self.optim.updates_per_batch != 1:
            raise ValueError(
                "optim.updates_per_batch: the preference trainer takes one update per batch "
                "(raise train.steps instead)"
            )
        return self

    def batch_pairs(self) -> int:
        """Pairs per optimizer step."""
        return self.online.pairs_per_step if self.mode == "online" else self.train.batch_size


def load_preference_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> PreferenceConfig:
    """Defaults <- YAML recipe <- ``a.b=c`` overrides, validated (raises :class:`ConfigError`)."""
    return load_validated(PreferenceConfig, path, overrides)
