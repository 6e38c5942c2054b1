"""Presets of the seed policy objectives (issue 8): off-policy, trust-region and
group-level objectives."""

from rlpost.core.presets.base import Choice, Preset, register_preset

register_preset(
    Preset(
        name="hard_pair_grpo",
        paper="Pair-GRPO family: Hard-Pair-GRPO (catalog 001-14)",
        catalog_id="001-14",
        advantage=Choice("soft_pair_grpo"),
        objective=Choice("hard_pair_grpo", {"eta": 0.1, "delta": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        kl=Choice("k3"),
        kl_coef=0.04,
        group_size=8,
        notes="pairwise advantages fitted to a box-constrained target log-ratio (local "
        "probability constraint) by a quadratic KL fit; eta 0.1 / delta 0.2 are ours",
    )
)

register_preset(
    Preset(
        name="implicit_pessimism",
        paper="Implicit pessimism of importance-weight-free off-policy objectives (catalog 000-01)",
        catalog_id="000-01",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("implicit_pessimism", {"beta": 1.0, "stabilize": True}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="score function on stale samples without IS + beta KL(mu||pi) anchor, negative "
        "advantages on the pessimistic linear surrogate; the abstract gives no "
        "hyper-parameters: beta 1 is ours",
    )
)

register_preset(
    Preset(
        name="ess_adaptive",
        paper="Batch-adaptive objective from the normalised ESS of the policy ratios (catalog 000-27)",
        catalog_id="000-27",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ess_adaptive"),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="no clip range and no objective hyper-parameters; the ESS is a batch statistic: "
        "feed the whole step's batch to one policy_loss call for the exact paper statistic",
    )
)

register_preset(
    Preset(
        name="up",
        paper="UP: Unbounded Positive asymmetric optimisation, token level on DAPO (catalog 004-15)",
        catalog_id="004-15",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("up", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=16,
        rollout=(Choice("dynamic_sampling"),),
        notes="DAPO recipe with UP's objective: anchored unclipped positive branch, "
        "clip 0.2/0.28 on negative advantages",
    )
)

register_preset(
    Preset(
        name="up_gspo",
        paper="UP: Unbounded Positive asymmetric optimisation, sequence level on GSPO (catalog 004-15)",
        catalog_id="004-15",
        advantage=Choice("grpo", {"scale_by_std": True}),
        ratio=Choice("sequence"),
        objective=Choice("up", {"clip_low": 3e-4, "clip_high": 4e-4}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="GSPO recipe with UP: the sequence ratio is anchored for positive advantages, "
        "GSPO's 3e-4/4e-4 clip for negative ones",
    )
)

register_preset(
    Preset(
        name="ripo",
        paper="RIPO: Riemannian Isometric Policy Optimization (catalog 004-08)",
        catalog_id="004-08",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ripo", {"delta": 0.1}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="GRPO with the Fisher-Rao trust region; delta 0.1 matches PPO's 0.2 at p = 1/2 "
        "(the abstract gives no value)",
    )
)

register_preset(
    Preset(
        name="sao",
        paper="SAO: Single-rollout Asynchronous Optimization (catalog 004-14)",
        catalog_id="004-14",
        advantage=Choice("gae", {"gamma": 1.0, "lam": 1.0, "whiten": True}),
        objective=Choice("sao", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=1,
        notes="one rollout per prompt, value-model baseline (GAE with gamma = lambda = 1: "
        "A_t = R - V_t), strict double-sided token clip 0.2; value-model training is the "
        "trainer's; lambda and eps are ours",
    )
)

register_preset(
    Preset(
        name="mu_grpo",
        paper="Mu-GRPO: how off-policy can GRPO be? (catalog 000-17)",
        catalog_id="000-17",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("mu_grpo", {"clip_low": 0.5, "clip_high": 1.0, "veto": True}),
        aggregation=Choice("token_mean"),
        group_size=8,
        rollout=(Choice("stages", {"stages": 4}),),
        notes="relaxed clip r in [0.5, 2] + negative-advantage veto after the first token "
        "outside it (or a trainer-given trigger_pos); trained in 4 large stages (the "
        "abstract's e.g.): each generates a quarter of all rollouts with the stage's "
        "starting policy, then runs that stage's optimiser steps on them. Clip bounds and "
        "trigger rule are ours",
    )
)

register_preset(
    Preset(
        name="conspo",
        paper="ConSPO: contrastive sequence-level policy optimisation (catalog 000-25)",
        catalog_id="000-25",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("conspo", {"tau": 0.1, "margin": 0.0, "margin_end": 0.1}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="only the sign of the advantage is read (verified positive / negative); "
        "needs group_ids and whole groups per micro-batch; the margin ramps 0 -> 0.1 with "
        "the training progress the trainer passes; tau 0.1 and the ramp are ours",
    )
)

register_preset(
    Preset(
        name="lpo",
        paper="LPO: listwise policy optimisation (catalog 001-17)",
        catalog_id="001-17",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("lpo", {"beta": 1.0, "divergence": "forward_kl"}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="target softmax_g(A / beta) on the sampled responses, exact forward-KL "
        "projection (reverse_kl / hellinger selectable); needs group_ids and whole groups "
        "per micro-batch; beta 1 is ours",
    )
)
