"""lerobot config of :class:`~rlpost.robot.lerobot_policy.RlpostFlowPolicy` (type ``rlpost_flow``).

The fields are :class:`rlpost.robot.policies.flow.FlowPolicyConfig`'s, under lerobot's
names where lerobot has one (``chunk_size``, ``n_action_steps``,
``num_inference_steps``), plus ``obs_layout``: where each lerobot observation feature's
entries sit in the flat observation vector the flow network reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.configs import FeatureType, NormalizationMode, PreTrainedConfig
from lerobot.optim.optimizers import AdamWConfig


@PreTrainedConfig.register_subclass("rlpost_flow")
@dataclass
class RlpostFlowConfig(PreTrainedConfig):
    """A flow-matching action-chunk policy of rlpost (Euler sampling from noise).

    ``obs_layout``: ``{feature: [positions in the flat observation]}``, e.g.
    ``{"observation.state": [0, 1, 2], "observation.environment_state": [3, 4]}``;
    ``condition_idx``: the flat state entries the velocity field reads (``None``: all);
    ``act_low`` / ``act_high``: the clamp of sampled actions (``None``: none).
    Observations are standardised inside the model (its ``obs_mean`` / ``obs_std``
    buffers) and actions are in the robot's units, so the processors' normalisation is
    the identity.
    """

    chunk_size: int = 8
    n_action_steps: int = 8
    num_inference_steps: int = 10
    hidden: int = 256
    n_blocks: int = 3
    time_dim: int = 32
    obs_layout: dict[str, list[int]] = field(default_factory=dict)
    condition_idx: list[int] | None = None
    act_low: list[float] | None = None
    act_high: list[float] | None = None
    normalization_mapping: dict[str, NormalizationMode] = field(
        default_factory=lambda: {
            "STATE": NormalizationMode.IDENTITY,
            "ENV": NormalizationMode.IDENTITY,
            "ACTION": NormalizationMode.IDENTITY,
        }
    )
    optimizer_lr: float = 3e-4
    optimizer_weight_decay: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(
                f"n_action_steps must be in [1, chunk_size={self.chunk_size}], "
                f"got {self.n_action_steps}"
            )
        if self.num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {self.num_inference_steps}")

    @property
    def obs_dim(self) -> int:
        return sum(len(v) for v in self.obs_layout.values())

    @property
    def observation_delta_indices(self) -> None:
        return None

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> AdamWConfig:
        return AdamWConfig(lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay)

    def get_scheduler_preset(self) -> None:
        return None

    def validate_features(self) -> None:
        """The layout covers each flat position once and names only state features."""
        if self.input_features and self.obs_layout:
            missing = [k for k in self.obs_layout if k not in self.input_features]
            if missing:
                raise ValueError(f"obs_layout names {missing}, not input features of the policy")
            for key, ft in self.input_features.items():
                if ft.type is FeatureType.VISUAL:
                    raise ValueError(f"{key}: rlpost_flow reads state features only, no cameras")
        flat = sorted(i for v in self.obs_layout.values() for i in v)
        if flat != list(range(len(flat))):
            raise ValueError(f"obs_layout must place each of 0..{len(flat) - 1} exactly once")
