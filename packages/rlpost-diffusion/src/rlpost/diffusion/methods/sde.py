"""SDE policy-gradient methods: Flow-GRPO, DanceGRPO and SLAS.

Each denoising step of an SDE rollout is a Gaussian "action" with a log-probability
(:mod:`rlpost.diffusion.sampler`); the loss is core's PPO clip over the stored transitions
(:func:`rlpost.diffusion.objectives.sde_policy_loss`). The three differ in their sampler,
their advantage and the trainer defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.core.presets import Choice
from rlpost.diffusion import objectives as obj
from rlpost.diffusion.methods.base import LossInput, LossOutput, Method, register_method


@dataclass(frozen=True)
class SDEClipParams:
    clip_range: float = 1e-4  # PPO clip of the per-step ratio (Flow-GRPO / DanceGRPO: 1e-4)

    def __post_init__(self) -> None:
        if not self.clip_range > 0:
            raise ValueError(f"clip_range must be > 0, got {self.clip_range}")


def sde_clip(inp: LossInput, p: SDEClipParams) -> LossOutput:
    """Per-sample PPO-clip surrogate of one stored denoising transition per sample."""
    loss, m = obj.sde_policy_loss(
        inp.logprob[:, None], inp.old_logprob[:, None], inp.advantages, p.clip_range
    )
    return LossOutput(loss, {"clip_frac": m["clip_frac"]})


register_method(
    Method(
        name="flow_grpo",
        paper="Liu et al. 2025, Flow-GRPO, arXiv:2505.05470",
        sampler=Choice("flow_grpo", {"a": 0.7}),
        family=Choice("sde_replay", {"timestep_fraction": 1.0}),
        advantage=Choice("grpo", {"eps": 1e-4, "clip": 5.0}),
        loss=sde_clip,
        params=SDEClipParams,
        regularizers=(Choice("kl", {"coef": 0.04}),),
    )
)
register_method(
    Method(
        name="dance_grpo",
        paper="Xue et al. 2025, DanceGRPO, arXiv:2505.07818",
        sampler=Choice("dance", {"eta": 0.3}),
        family=Choice("sde_replay", {"timestep_fraction": 0.6}),
        advantage=Choice("grpo", {"eps": 1e-4, "clip": 5.0}),
        loss=sde_clip,
        params=SDEClipParams,
        shared_noise=True,
    )
)
register_method(
    Method(
        name="slas",
        paper="SLAS: super-linear advantage shaping (catalog 000-29)",
        sampler=Choice("dance", {"eta": 0.3}),
        family=Choice("sde_replay", {"timestep_fraction": 0.6}),
        advantage=Choice("slas", {"gamma": 0.5, "eps": 1e-4}),
        loss=sde_clip,
        params=SDEClipParams,
        shared_noise=True,
    )
)
