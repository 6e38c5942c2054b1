"""Typed config of a robot post-training run (``rlpost-robot train --config <recipe>``).

Defaults <- YAML recipe <- ``key.sub=value`` overrides, validated at load by
:func:`rlpost.core.io.config.load_validated` (errors name the dotted field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlpost.core.io.config import ConfigError, load_validated

__all__ = ["Config", "ConfigError", "load_config", "recipe_path"]

RECIPES_DIR = Path(__file__).parent / "recipes"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PolicyConfig(_Strict):
    kind: Literal["flow", "act", "gaussian"] = "flow"
    """``flow``: our flow-matching chunk policy; ``act``: lerobot's ACT (lerobot extra);
    ``gaussian``: a Gaussian chunk policy (log-probabilities for policy gradients)."""
    horizon: int = Field(4, ge=1)
    hidden: int = Field(256, ge=8)
    """MLP width (``flow`` and ``gaussian``)."""
    dim_model: int = Field(64, ge=8)
    """ACT transformer width (``act`` only)."""
    bc_steps: int = Field(3000, ge=1)


class DemoConfig(_Strict):
    n_good: int = Field(10, ge=0)
    n_poor: int = Field(30, ge=0)


class OTQLSection(_Strict):
    episodes: int = Field(60, ge=1)
    envs: int = Field(4, ge=1)
    beta: float = Field(1.0, gt=0)
    ot_coef: float = Field(0.25, ge=0)
    data_coef: float = Field(1.0, ge=0)
    coupling: Literal["ot", "independent"] = "ot"
    k_samples: int = Field(8, ge=1)
    updates_per_round: int = Field(20, ge=1)
    critic_pretrain_steps: int = Field(1000, ge=0)


class PACACTSection(_Strict):
    episodes: int = Field(160, ge=1)
    envs: int = Field(8, ge=1)
    explore_std: float = Field(0.02, ge=0)
    q_coef: float = Field(2.5, ge=0)
    prior_coef: float = Field(10.0, ge=0)
    prior_mix: float = Field(0.5, ge=0, le=1)
    force_excess_coef: float = Field(0.1, ge=0)
    force_violation_coef: float = Field(0.02, ge=0)
    updates_per_round: int = Field(50, ge=1)
    critic_pretrain_steps: int = Field(500, ge=0)
    actor_lr: float = Field(3e-5, gt=0)


class CRAFTSection(_Strict):
    episodes: int = Field(320, ge=1)
    envs: int = Field(16, ge=1)
    group: int = Field(8, ge=2)
    mode: Literal["craft", "real", "proxy"] = "craft"
    proxy: str = "kinematic"
    residual_coef: float = Field(1.0, ge=0)
    kl_coef: float = Field(0.1, ge=0)
    kl_forward: float = Field(1.0, ge=0)
    kl_reverse: float = Field(0.0, ge=0)
    ema_decay: float = Field(0.9, ge=0, lt=1)
    gae_lambda: float = Field(0.9, ge=0, le=1)
    lr: float = Field(3e-4, gt=0)
    updates_per_round: int = Field(4, ge=1)


class RunConfig(_Strict):
    dir: str = "runs/robot"
    seed: int = 0
    eval_episodes: int = Field(100, ge=1)
    eval_steps: list[int] = [10, 3, 1]
    progress: bool = True
    threads: int | None = Field(None, ge=1)


class Config(_Strict):
    task: str = "multimodal_reach"
    algo: Literal["otql", "pac_act", "craft"] = "otql"
    policy: PolicyConfig = PolicyConfig()
    demos: DemoConfig = DemoConfig()
    otql: OTQLSection = OTQLSection()
    pac_act: PACACTSection = PACACTSection()
    craft: CRAFTSection = CRAFTSection()
    run: RunConfig = RunConfig()

    @model_validator(mode="after")
    def _algo_policy(self) -> Config:
        need = {"otql": "flow", "pac_act": "act", "craft": "gaussian"}[self.algo]
        if self.policy.kind != need:
            raise ValueError(
                f"algo {self.algo!r} fine-tunes a policy.kind={need!r} policy, "
                f"got policy.kind={self.policy.kind!r}"
            )
        if self.algo == "craft" and self.craft.mode != "real":
            from rlpost.robot.algos.craft import PROXIES

            have = sorted(PROXIES.get(self.task, {}))
            if self.craft.proxy not in have:
                raise ValueError(
                    f"craft.proxy={self.craft.proxy!r} is not a counterfactual model of task "
                    f"{self.task!r} (have {have}); use craft.mode=real or another task"
                )
        return self

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from rlpost.robot.envs import TASKS

        if v not in TASKS:
            raise ValueError(f"must be one of {sorted(TASKS)}, got {v!r}")
        return v


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    return load_validated(Config, path, overrides)


def recipe_path(name_or_path: str) -> Path:
    """A YAML path as given, or the shipped recipe of that name (``.yaml`` optional)."""
    given = Path(name_or_path)
    if given.is_file():
        return given
    shipped = RECIPES_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise FileNotFoundError(f"no file {name_or_path!r} and no shipped recipe; {names}")
