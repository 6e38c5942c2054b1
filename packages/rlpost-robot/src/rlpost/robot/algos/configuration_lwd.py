"""The light configuration of the ``lwd`` algorithm: its config dataclass and its
registration (the runner and any load-time check named as ``module:function``, imported
when a run starts), so that validating a recipe does not import the algorithm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlpost.robot.algos.base import Algorithm, check_ranges, register_algorithm


@dataclass(frozen=True)
class LWDConfig:
    episodes: int = 60
    """Online budget of the single-robot loop (episodes summed over the parallel envs)."""
    envs: int = 4
    sample_steps: int = 10
    """Flow integration steps: acting, and the grid of the QAM update."""
    gamma: float = 0.99
    """Discount per control step (a chunk of ``k`` executed steps discounts ``gamma^k``)."""
    atoms: int = 51
    v_min: float = -0.1
    v_max: float = 1.1
    tau_offline: float = 0.6
    tau_online: float = 0.9
    tau_alpha: float = 0.3
    tau_min: float = 0.1
    tau_max: float = 0.95
    inv_temp: float = 50.0
    """``1 / lambda`` of the tilted target ``pi_base exp(Q / lambda)``."""
    base: Literal["frozen", "replay"] = "replay"
    """``pi_base``: a flow kept fitted by BC to the replay (demonstrations + fleet data),
    whose EMA is the base (QAM's reference code; the default), or the BC policy as it was
    (``frozen``, LWD's choice: with it success peaks, then falls back as the critic's
    values saturate; docs/algorithms/lwd.md)."""
    base_lr: float = 1e-4
    base_ema: float = 0.005
    offline_steps: int = 1000
    """Updates on the demonstrations alone before the first online episode."""
    updates_per_round: int = 20
    batch_size: int = 128
    online_fraction: float = 0.5
    """Share of each batch drawn from online data once there is some (LWD: 1:1)."""
    critic_lr: float = 3e-4
    policy_lr: float = 1e-4
    hidden: int = 256
    target_tau: float = 0.005
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            nonneg=("offline_steps", "inv_temp", "tau_alpha"),
            positive=("critic_lr", "policy_lr", "grad_clip", "base_lr"),
            counts=("episodes", "envs", "sample_steps", "updates_per_round", "batch_size"),
            unit=(
                "gamma",
                "target_tau",
                "online_fraction",
                "tau_offline",
                "tau_online",
                "base_ema",
            ),
        )
        if self.base not in ("frozen", "replay"):
            raise ValueError(f"base must be 'frozen' or 'replay', got {self.base!r}")
        if self.atoms < 2:
            raise ValueError(f"atoms must be >= 2, got {self.atoms}")
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min must be < v_max, got {self.v_min} >= {self.v_max}")
        if not 0.0 < self.tau_min <= self.tau_max < 1.0:
            raise ValueError(
                f"need 0 < tau_min <= tau_max < 1, got tau_min={self.tau_min}, "
                f"tau_max={self.tau_max}"
            )


register_algorithm(
    Algorithm(
        name="lwd",
        title="LWD",
        paper="Learning While Deploying: DIVL values + QAM flow policy extraction (catalog 001-23)",
        config=LWDConfig,
        policy_kind="flow",
        run="rlpost.robot.algos.lwd:run",
        fleet="rlpost.robot.algos.lwd:LWDRounds",
    )
)
