"""Presets of the seed ratio and importance-correction entries (issue 8)."""

from rlpost.core.presets.base import Choice, Preset, register_preset

register_preset(
    Preset(
        name="ftis",
        paper="F-TIS: filtered truncated importance sampling for heterogeneous models (catalog 000-09)",
        catalog_id="000-09",
        advantage=Choice("grpo", {"scale_by_std": True}),
        correction=Choice("ftis", {"cap": 2.0, "filter_low": 0.2, "filter_level": "sequence"}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="GRPO on samples from other participants' models; pass the generating model's "
        "log-probs as rollout_logp. The abstract gives no numbers: cap 2 and the sequence "
        "filter at geometric-mean ratio 0.2 are ours",
    )
)

register_preset(
    Preset(
        name="ctpo",
        paper="CTPO: cumulative token policy optimisation (catalog 001-09)",
        catalog_id="001-09",
        advantage=Choice("grpo", {"scale_by_std": True}),
        ratio=Choice("cumulative"),
        objective=Choice("ctpo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="prefix-product ratio, log-space clip +-0.2 sqrt(t) (0.2: ours, PPO's width at t = 1)",
    )
)

register_preset(
    Preset(
        name="sis",
        paper="SIS: selective importance sampling (catalog 004-17)",
        catalog_id="004-17",
        advantage=Choice("grpo", {"scale_by_std": True}),
        correction=Choice("sis", {"envelope": 2.0}),
        objective=Choice("reinforce"),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="the SIS weights replace the policy ratio (REINFORCE objective w A log pi); "
        "envelope 2 is ours; seed the global torch RNG per step (or set seed: reproducible "
        "per batch, fresh across steps)",
    )
)

register_preset(
    Preset(
        name="ring_zero",
        paper="Ring-2.5-1T-Zero: clipped IS and training-inference ratio correction (catalog 004-02)",
        catalog_id="004-02",
        advantage=Choice("grpo", {"scale_by_std": True}),
        correction=Choice(
            "clipped_is", {"low": 0.5, "high": 2.0, "mask_low": 0.2, "mask_high": 5.0}
        ),
        objective=Choice("cispo", {"clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="clipped IS of the policy ratio (CISPO-style weight clip) and a two-sided clipped "
        "engine-ratio correction with a mask band; all numbers are ours (the abstract gives none)",
    )
)

register_preset(
    Preset(
        name="predictive_divergence_mask",
        paper="Predictive divergence mask for DPPO-style trust regions (catalog 004-05)",
        catalog_id="004-05",
        advantage=Choice("grpo", {"scale_by_std": True}),
        correction=Choice("predictive_divergence_mask", {"divergence": "tv", "threshold": 0.15}),
        objective=Choice("is_pg"),
        aggregation=Choice("token_mean"),
        group_size=8,
        notes="unclipped IS policy gradient under a TV trust region (delta 0.15, ours) with the "
        "predicted direction; pass token_dists (engine top-K or full) to Recipe.policy_loss",
    )
)
