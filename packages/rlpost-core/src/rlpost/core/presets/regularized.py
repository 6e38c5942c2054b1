"""Presets whose method lives in the KL term or a trainer schedule: REVA-PO (004-09)."""

from rlpost.core.presets.base import Choice, Preset, register_preset

register_preset(
    Preset(
        name="reva_po",
        paper="REVA-PO: response-weighted and validation-anchored policy optimisation (catalog 004-09)",
        catalog_id="004-09",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        kl=Choice("reva_rer", {"alpha": 0.5, "gamma": 0.5, "estimator": "k3"}),
        kl_coef=0.04,
        group_size=8,
        hooks=(Choice("validation_reset"),),
        notes="GRPO with the KL weighted per response by advantage and reference entropy "
        "(RER) and VAPR (at each evaluation, policy and reference reset to the best "
        "validation checkpoint when the current one is worse); alpha, gamma 0.5 and beta "
        "0.04 are ours",
    )
)
