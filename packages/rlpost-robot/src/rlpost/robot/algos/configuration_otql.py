"""The light configuration of the ``otql`` algorithm: its config dataclass and its
registration (the runner and any load-time check named as ``module:function``, imported
when a run starts), so that validating a recipe does not import the algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlpost.robot.algos.base import Algorithm, check_ranges, register_algorithm


@dataclass(frozen=True)
class OTQLConfig:
    episodes: int = 60
    """Online interaction budget (episodes summed over the parallel envs)."""
    envs: int = 4
    sample_steps: int = 10
    """Integration steps of the acting policy during fine-tuning."""
    gamma: float = 0.99
    expectile: float = 0.7
    beta: float = 1.0
    weight_clip: float = 20.0
    k_samples: int = 8
    ot_coef: float = 0.25
    data_coef: float = 1.0
    coupling: Literal["ot", "independent"] = "ot"
    updates_per_round: int = 20
    critic_pretrain_steps: int = 1000
    batch_size: int = 128
    critic_lr: float = 3e-4
    policy_lr: float = 1e-4
    hidden: int = 256
    target_tau: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            nonneg=("ot_coef", "data_coef", "critic_pretrain_steps", "weight_clip"),
            positive=("beta", "critic_lr", "policy_lr"),
            counts=("episodes", "envs", "sample_steps", "updates_per_round", "batch_size"),
            unit=("gamma", "target_tau"),
        )
        if not 0 < self.expectile < 1:
            raise ValueError(f"expectile must be in (0, 1), got {self.expectile}")
        if self.k_samples < 1:
            raise ValueError(f"k_samples must be >= 1, got {self.k_samples}")
        if self.coupling not in ("ot", "independent"):
            raise ValueError(f"coupling must be 'ot' or 'independent', got {self.coupling!r}")


register_algorithm(
    Algorithm(
        name="otql",
        title="OTQL",
        paper="OTQL: optimal-transport Q-learning for flow policies (catalog 004-16)",
        config=OTQLConfig,
        policy_kind="flow",
        run="rlpost.robot.algos.otql:run",
        fleet="rlpost.robot.algos.otql:OTQLRounds",
    )
)
