"""The standard family every user expects: GRPO, DAPO, Dr. GRPO, GSPO, RLOO,
REINFORCE++ and PPO with a critic."""

from rlpost.core.presets.base import Choice, Preset, register_preset

register_preset(
    Preset(
        name="grpo",
        paper="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
        catalog_id="base",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        kl=Choice("k3"),
        kl_coef=0.04,
        group_size=64,
        notes="group size 64, clip 0.2, beta 0.04 with the k3 estimator in the loss (paper, sec. 4.1)",
    )
)

register_preset(
    Preset(
        name="dapo",
        paper="Yu et al. 2025, DAPO, arXiv:2503.14476",
        catalog_id="base",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.28}),
        aggregation=Choice("token_mean"),
        group_size=16,
        rollout=(Choice("dynamic_sampling"),),
        notes="clip-higher 0.2/0.28, token-level loss, dynamic sampling, no KL, 16 samples per prompt; "
        "overlong filtering/shaping is a trainer option",
    )
)

register_preset(
    Preset(
        name="dr_grpo",
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO), arXiv:2503.20783",
        catalog_id="base",
        advantage=Choice("grpo", {"scale_by_std": False}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("constant"),
        group_size=8,
        notes="no std scaling, constant normaliser = the generation budget (3000 tokens in the "
        "paper; the trainer passes its max new tokens, PolicyBatch.generation_budget), no KL",
    )
)

register_preset(
    Preset(
        name="gspo",
        paper="Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
        catalog_id="base",
        advantage=Choice("grpo", {"scale_by_std": True}),
        ratio=Choice("sequence"),
        objective=Choice("ppo_clip", {"clip_low": 3e-4, "clip_high": 4e-4}),
        aggregation=Choice("seq_mean_token_mean"),
        group_size=8,
        notes="length-normalised sequence ratio clipped to [1 - 3e-4, 1 + 4e-4] (paper, sec. 5.1)",
    )
)

register_preset(
    Preset(
        name="rloo",
        paper="Ahmadian et al. 2024, Back to Basics: REINFORCE style optimization, arXiv:2402.14740",
        catalog_id="base",
        advantage=Choice("rloo"),
        objective=Choice("reinforce"),
        aggregation=Choice("seq_mean_token_sum"),
        kl=Choice("k1"),
        kl_coef=0.05,
        kl_in_reward=True,
        group_size=4,
        notes="leave-one-out baseline, k = 4 samples, whole response as one action, KL in the reward",
    )
)

register_preset(
    Preset(
        name="reinforce_pp",
        paper="Hu 2025, REINFORCE++, arXiv:2501.03262",
        catalog_id="base",
        advantage=Choice("reinforce_pp"),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        kl=Choice("k1"),
        kl_coef=0.01,
        kl_in_reward=True,
        group_size=1,
        notes="batch-normalised returns, token-level KL penalty in the reward (beta 0.01), clip 0.2",
    )
)

register_preset(
    Preset(
        name="ppo",
        paper="Schulman et al. 2017, arXiv:1707.06347; Ouyang et al. 2022 (RLHF), arXiv:2203.02155",
        catalog_id="base",
        advantage=Choice("gae", {"gamma": 1.0, "lam": 0.95}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("token_mean"),
        kl=Choice("k1"),
        kl_coef=0.02,
        kl_in_reward=True,
        group_size=1,
        notes="GAE(gamma=1, lambda=0.95) with a critic, KL in the reward",
    )
)
