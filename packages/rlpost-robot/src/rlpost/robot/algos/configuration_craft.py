"""The light configuration of the ``craft`` algorithm: its config dataclass and its
registration (the runner and any load-time check named as ``module:function``, imported
when a run starts), so that validating a recipe does not import the algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlpost.robot.algos.base import Algorithm, check_ranges, register_algorithm


@dataclass(frozen=True)
class CRAFTConfig:
    episodes: int = 320
    """Online interaction budget (episodes summed over the parallel envs)."""
    envs: int = 16
    group: int = 8
    """G: candidate chunks per visited state (the executed one is the first)."""
    mode: Literal["craft", "real", "proxy"] = "craft"
    """``craft``: proxy + grounded residual; ``real``: closed-loop REINFORCE only (the
    residual with a zero proxy); ``proxy``: counterfactual advantages only."""
    proxy: str = "kinematic"
    """Name of the task's counterfactual model in :data:`PROXIES`."""
    residual_coef: float = 1.0
    kl_coef: float = 0.1
    kl_forward: float = 1.0
    kl_reverse: float = 0.0
    ema_decay: float = 0.9
    gamma: float = 0.99
    gae_lambda: float = 0.9
    """lambda of the chunk-level GAE of the grounded (real) advantage."""
    proxy_scale: float | Literal["fit"] = "fit"
    """Scale of the group-normalised proxy: ``fit`` = the least-squares scale onto the
    grounded advantages of the executed chunks (>= 0), refitted every round."""
    lr: float = 3e-4
    updates_per_round: int = 4
    value_steps: int = 100
    min_log_std: float = -3.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            nonneg=("residual_coef", "kl_coef", "kl_forward", "kl_reverse", "value_steps"),
            positive=("lr",),
            counts=("episodes", "envs", "updates_per_round"),
            unit=("ema_decay", "gamma", "gae_lambda"),
        )
        if self.ema_decay >= 1:
            raise ValueError(f"ema_decay must be < 1, got {self.ema_decay}")
        if self.mode not in ("craft", "real", "proxy"):
            raise ValueError(f"mode must be craft, real or proxy, got {self.mode!r}")
        if self.group < 2 and self.mode != "real":
            raise ValueError(f"group must be >= 2 for counterfactual advantages, got {self.group}")


register_algorithm(
    Algorithm(
        name="craft",
        title="CRAFT",
        paper="CRAFT: counterfactual proxy + grounded residual policy gradients (catalog 001-19)",
        config=CRAFTConfig,
        policy_kind="gaussian",
        run="rlpost.robot.algos.craft:run",
        check="rlpost.robot.algos.craft:_check_proxy",
    )
)
