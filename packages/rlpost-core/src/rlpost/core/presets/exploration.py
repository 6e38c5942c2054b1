"""Presets that change how a group's rollouts are drawn: FBOS-RL's feedback-guided
re-rollouts with its two objectives (000-15) and their one-objective ablations."""

from rlpost.core.feedback import FeedbackExploration
from rlpost.core.presets.base import Choice, Preset, register_preset

_FBOS = {
    "paper": "FBOS-RL: Feedback-Driven Bi-Objective Synergistic Reinforcement Learning "
    "(catalog 000-15)",
    "catalog_id": "000-15",
    "advantage": Choice("grpo", {"scale_by_std": True}),
    "objective": Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
    "aggregation": Choice("token_mean"),
    "group_size": 8,
}

register_preset(
    Preset(
        name="fbos",
        feedback=FeedbackExploration(share=0.5, epa=True, ecc=True),
        notes="half of each group re-rolled from a failed attempt plus the environment's "
        "feedback; verified guided solutions trained under the bare prompt (EPA) and the "
        "guided rollouts in their own context and group (ECC); same rollouts as GRPO",
        **_FBOS,
    )
)

register_preset(
    Preset(
        name="fbos_epa",
        feedback=FeedbackExploration(share=0.5, epa=True, ecc=False),
        notes="FBOS-RL's ablation: EPA only (guided solutions under the bare prompt)",
        **_FBOS,
    )
)

register_preset(
    Preset(
        name="fbos_ecc",
        feedback=FeedbackExploration(share=0.5, epa=False, ecc=True),
        notes="FBOS-RL's ablation: ECC only (guided rollouts trained in their context)",
        **_FBOS,
    )
)
