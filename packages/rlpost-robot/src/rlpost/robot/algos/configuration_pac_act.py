"""The light configuration of the ``pac_act`` algorithm: its config dataclass and its
registration (the runner and any load-time check named as ``module:function``, imported
when a run starts), so that validating a recipe does not import the algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlpost.robot.algos.base import Algorithm, check_ranges, register_algorithm


@dataclass(frozen=True)
class PACACTConfig:
    episodes: int = 160
    """Online interaction budget (episodes summed over the parallel envs)."""
    envs: int = 8
    gamma: float = 0.99
    explore_std: float = 0.02
    """Std of the Gaussian exploration noise on every chunk entry (action units)."""
    q_coef: float = 2.5
    """alpha: weight of the normalised Q term of the actor loss."""
    prior_coef: float = 10.0
    """lambda: weight of the hybrid behaviour-prior constraint (0: unconstrained)."""
    prior_mix: float = 0.5
    """m: share of the anchor to the pretrained actor (the rest is demonstration BC)."""
    demo_weighting: Literal["uniform", "advantage"] = "uniform"
    """Demonstration BC weights: uniform, or ``exp(beta A / std(A))`` (clipped at 20,
    mean 1) with the critic's advantage of the demonstrated chunk over the actor's."""
    demo_beta: float = 1.0
    force_excess_coef: float = 0.1
    force_violation_coef: float = 0.02
    updates_per_round: int = 50
    critic_pretrain_steps: int = 500
    policy_delay: int = 2
    batch_size: int = 128
    critic_lr: float = 3e-4
    actor_lr: float = 3e-5
    hidden: int = 256
    target_tau: float = 0.01
    target_noise: float = 0.05
    target_noise_clip: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            nonneg=(
                "explore_std",
                "prior_coef",
                "q_coef",
                "force_excess_coef",
                "force_violation_coef",
                "critic_pretrain_steps",
                "demo_beta",
            ),
            positive=("critic_lr", "actor_lr"),
            counts=("episodes", "envs", "updates_per_round", "policy_delay", "batch_size"),
            unit=("prior_mix", "gamma", "target_tau"),
        )


register_algorithm(
    Algorithm(
        name="pac_act",
        title="PAC-ACT",
        paper="PAC-ACT: safe actor-critic fine-tuning of ACT (catalog 004-10)",
        config=PACACTConfig,
        policy_kind="act",
        run="rlpost.robot.algos.pac_act:run",
    )
)
