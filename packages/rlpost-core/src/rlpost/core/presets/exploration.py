"""Presets that change how a group's rollouts are drawn: FBOS-RL's feedback-guided
re-rollouts with its two objectives (000-15) and their one-objective ablations, and
RubricEM's reflection meta-policy (000-30), whose guided contexts the policy writes. Each
names the LLM trainer's ``feedback`` rollout source with
:class:`rlpost.core.feedback.FeedbackExploration`'s settings as its params, except
``rubricem_episodes``, RubricEM on multi-turn episodes, which names its
``episode_reflection`` source with :class:`rlpost.core.feedback.EpisodeReflection`'s."""

from rlpost.core.presets.advantages import RUBRICEM
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
        rollout=(Choice("feedback", {"share": 0.5, "epa": True, "ecc": True}),),
        notes="half of each group re-rolled from a failed attempt plus the environment's "
        "feedback; verified guided solutions trained under the bare prompt (EPA) and the "
        "guided rollouts in their own context and group (ECC); same rollouts as GRPO",
        **_FBOS,
    )
)

register_preset(
    Preset(
        name="fbos_epa",
        rollout=(Choice("feedback", {"share": 0.5, "epa": True, "ecc": False}),),
        notes="FBOS-RL's ablation: EPA only (guided solutions under the bare prompt)",
        **_FBOS,
    )
)

register_preset(
    Preset(
        name="fbos_ecc",
        rollout=(Choice("feedback", {"share": 0.5, "epa": False, "ecc": True}),),
        notes="FBOS-RL's ablation: ECC only (guided rollouts trained in their context)",
        **_FBOS,
    )
)

register_preset(
    Preset(
        name="rubricem_reflect",
        paper="RubricEM: Meta-RL with Rubric-guided Policy Decomposition beyond Verifiable "
        "Rewards (catalog 000-30)",
        catalog_id="000-30",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=8,
        rollout=(
            Choice(
                "feedback",
                {
                    "share": 0.5,
                    "reflector": "policy",
                    "meta": True,
                    "template": "{response}{feedback}>{prompt}",
                },
            ),
        ),
        notes="RubricEM's reflection meta-policy: the shared backbone reflects on a judged "
        "failure (reflect_template), each of half the group's re-rollouts is guided by a "
        "reflection of its own, and the reflections are trained by GRPO on the verdicts of "
        "the attempts they guided (algo.feedback={meta: false} freezes them); guided "
        "solutions train the bare prompt (EPA) and the guided rollouts their context (ECC)",
    )
)

register_preset(
    Preset(
        name="rubricem_episodes",
        **RUBRICEM,
        rollout=(Choice("episode_reflection", {"share": 0.5, "meta": True}),),
        notes="RubricEM whole on multi-turn episodes: Stage-Structured GRPO on the judge's "
        "stages (data.env.turn_signal=rubric), and the reflection meta-policy: the shared "
        "backbone reflects on each task's first failed episode as the judge scored it, half "
        "the group's episodes are guided by a reflection each, and the reflections are "
        "trained on the outcomes of the episodes they guided",
    )
)
