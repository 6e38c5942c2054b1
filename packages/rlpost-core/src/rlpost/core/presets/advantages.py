"""Presets of the seed advantage estimators and reward shaping (issue 7)."""

from rlpost.core.presets.base import Choice, Preset, register_preset

register_preset(
    Preset(
        name="river",
        paper="RiVER: ranking-induced verifiable rewards for score-based tasks (catalog 004-29)",
        catalog_id="004-29",
        advantage=Choice("river", {"other_credit": 0.5}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="group-relative RL on continuous execution scores; the abstract gives no numeric "
        "hyper-parameters: credit bound 0.5 and DAPO-style clipping are our defaults",
    )
)

register_preset(
    Preset(
        name="hmpo",
        paper="HMPO, Hybrid Median-length Policy Optimization, in Mach-Mind-4-Flash (catalog 004-11b)",
        catalog_id="004-11b",
        advantage=Choice("hmpo", {"alpha": 0.2}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="single-stage length shaping inside GRPO; the abstract gives no hyper-parameters: "
        "alpha 0.2 and DAPO-style clipping are our defaults",
    )
)

register_preset(
    Preset(
        name="icr",
        paper="ICR: implicit compression regularisation (catalog 001-10)",
        catalog_id="001-10",
        advantage=Choice("icr", {"coef": 0.1}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="GRPO plus a pull toward each group's shortest correct responses in the "
        "overthinking regime; the abstract gives no hyper-parameters: coef 0.1 is ours",
    )
)

register_preset(
    Preset(
        name="soft_pair_grpo",
        paper="Pair-GRPO family: Soft-Pair-GRPO (catalog 001-14)",
        catalog_id="001-14",
        advantage=Choice("soft_pair_grpo"),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        kl=Choice("k3"),
        kl_coef=0.04,
        group_size=8,
        notes="pairwise win-rate advantages with GRPO's clipped surrogate and KL kept (the "
        "abstract's 'retaining GRPO's clipped surrogate and KL-regularized structure')",
    )
)

register_preset(
    Preset(
        name="basis",
        paper="BASIS: single-rollout critic-free RL with a batch-pooled value estimate (catalog 000-02)",
        catalog_id="000-02",
        advantage=Choice("basis"),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=1,
        notes="one rollout per prompt; the trainer must pass prompt features (e.g. mean-pooled "
        "prompt hidden states); the ridge strength is chosen per batch by leave-one-out error",
    )
)

register_preset(
    Preset(
        name="gcpo",
        paper="GCPO: geometry-aware calibrated policy optimisation (catalog 000-10)",
        catalog_id="000-10",
        advantage=Choice("gcpo", {"w_min": 0.25, "w_max": 4.0}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="GRPO with uncertainty-calibrated weights; needs response embeddings as features; "
        "weight clip [0.25, 4] is ours",
    )
)

register_preset(
    Preset(
        name="ed_grpo",
        paper="EDO: exploration-driven optimisation, ED-GRPO variant (catalog 001-04)",
        catalog_id="001-04",
        advantage=Choice("ed_grpo", {"alpha": 0.05}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="GRPO on rewards biased by the per-token self-information of each response; "
        "needs behaviour log-probs; alpha 0.05 is ours",
    )
)

for _name in ("tea", "prefix_tea"):
    register_preset(
        Preset(
            name=_name,
            paper="Tail-Extrapolated estimators for best-of-N post-training (catalog 001-02)",
            catalog_id="001-02",
            advantage=Choice(_name, {"n": 16}),
            objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
            aggregation=Choice("seq_mean_token_mean"),
            group_size=8,
            notes="m = 8 training rollouts aimed at best-of-16 deployment; set n to the "
            "deployment N (the abstract gives no numeric hyper-parameters)",
        )
    )

register_preset(
    Preset(
        name="entrocraft",
        paper="Entrocraft: rejection sampling of the advantage distribution for a user entropy "
        "schedule (catalog 001-28)",
        catalog_id="001-28",
        advantage=Choice("entrocraft", {"start": 1.0, "end": 0.8, "gain": 10.0, "p_max": 1.0}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="linear anneal of the entropy from 1.0 to 0.8 x its initial value over training "
        "(the abstract reports that a linear anneal to a slightly lower target works best but "
        "gives no numbers); gain, p_max and DAPO-style clipping are our defaults; the trainer "
        "passes logprobs and TrainingDynamics",
    )
)

register_preset(
    Preset(
        name="fade",
        paper="FADE: Focal Advantage with Dynamic Entropy (catalog 004-21)",
        catalog_id="004-21",
        advantage=Choice("fade", {"gamma": 2.0, "suppress": 0.5, "margin": 0.3}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="the abstract gives no hyper-parameters: gamma 2, suppression 0.5, a 30% entropy "
        "drop for full exploration and DAPO-style clipping are our defaults; the trainer "
        "passes TrainingDynamics",
    )
)

register_preset(
    Preset(
        name="vpo",
        paper="Vector Policy Optimization (catalog 000-08)",
        catalog_id="000-08",
        advantage=Choice("vpo", {"n_weights": 1024, "concentration": 1.0}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="drop-in for GRPO's advantage on vector rewards [B, K]; Dirichlet(1) "
        "trade-offs are ours",
    )
)
register_preset(
    Preset(
        name="rdpo",
        paper="Reward-Decorrelated Policy Optimization, LongCat-Flash (catalog 000-24)",
        catalog_id="000-24",
        advantage=Choice("rdpo"),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="multi-reward processing before a GRPO-style update; the abstract gives no "
        "hyper-parameters",
    )
)

register_preset(
    Preset(
        name="a2tgpo",
        paper="A²TGPO: Agentic Turn-Group Policy Optimization with Adaptive Turn-level "
        "Clipping (catalog 001-15)",
        catalog_id="001-15",
        advantage=Choice(
            "a2tgpo", {"gamma": 1.0, "outcome_weight": 1.0, "eps_min": 0.1, "eps_max": 0.3}
        ),
        objective=Choice("ppo_clip_turn", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="pass AdvantageOutput.clip_range to Recipe.policy_loss(clip_range=...); the "
        "objective's 0.2 is the fallback without it. The abstract gives no hyper-parameters: "
        "gamma 1, outcome weight 1 and eps in [0.1, 0.3] are ours",
    )
)

register_preset(
    Preset(
        name="step_opsd",
        paper="StepOPSD: step-level post-rollout preference self-distillation for multi-turn "
        "agents (catalog 000-03)",
        catalog_id="000-03",
        advantage=Choice("step_opsd", {"alpha_clip": 0.2, "lambda_mix": 0.5}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="GRPO whose trajectory advantage is redistributed over the agent's steps by a "
        "hindsight self-teacher's log-prob gaps, never changing its sign; the trainer's "
        "teacher is distill.teachers [{path: self, template: '{hindsight}{prompt}'}] (the "
        "group's shortest solved episode as the hint). alpha_clip 0.2 (the abstract: small "
        "is stabilising) and lambda_mix 0.5 (task-dependent) are ours",
    )
)

#: RubricEM's Stage-Structured GRPO, shared by ``rubricem`` and (with the reflection on
#: judged episodes) ``rubricem_episodes`` in :mod:`.exploration`.
RUBRICEM = {
    "paper": "RubricEM: Meta-RL with Rubric-guided Policy Decomposition beyond Verifiable "
    "Rewards (catalog 000-30)",
    "catalog_id": "000-30",
    "advantage": Choice("stage_grpo", {"stage_weight": 1.0, "outcome_weight": 1.0}),
    "objective": Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
    "aggregation": Choice("token_mean"),
    "group_size": 8,
}

register_preset(
    Preset(
        name="rubricem",
        **RUBRICEM,
        notes="Stage-Structured GRPO: each stage's tokens get its own group-normalised rubric "
        "score (the trainer's judge: data.env.turn_signal=rubric) plus the outcome "
        "advantage. Equal stage and outcome weights are ours",
    )
)
