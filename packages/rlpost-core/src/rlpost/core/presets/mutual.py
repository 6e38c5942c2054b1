"""Mutual RL (catalog 001-11): GRPO policies that keep separate parameters, objectives and
tokenizers and exchange experience on the prompts they share. The three probes differ only
in what a peer's response becomes in the policy's batch (:mod:`rlpost.core.peers`); who
the peers are is the trainer's configuration (``rlpost-llm``'s ``mutual`` section)."""

from rlpost.core.peers import PeerSharing
from rlpost.core.presets.base import Choice, Preset, register_preset

_PAPER = "Mutual Reinforcement Learning (catalog 001-11)"
_PG = {
    "advantage": Choice("grpo", {"scale_by_std": True}),
    "objective": Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
    "aggregation": Choice("seq_mean_token_mean"),
    "group_size": 8,
}

register_preset(
    Preset(
        name="prp",
        paper=f"{_PAPER}: Peer Rollout Pooling, weighted by F-TIS (000-09)",
        catalog_id="001-11",
        correction=Choice("ftis", {"cap": 2.0, "filter_low": 0.2, "filter_level": "sequence"}),
        peers=PeerSharing("pool"),
        notes="the peers' responses, retokenised, join each group and are trained on; the "
        "density ratio to the generating peer (block log-probs spread over the policy's "
        "tokens) is filtered and truncated by F-TIS (cap 2, filter 0.2: ours)",
        **_PG,
    )
)

register_preset(
    Preset(
        name="xgrpo",
        paper=f"{_PAPER}: Cross-Policy GRPO Advantage Sharing",
        catalog_id="001-11",
        peers=PeerSharing("baseline"),
        notes="the group baseline (mean and std of rewards) is taken over the policy's and "
        "its peers' responses; only its own responses are trained on",
        **_PG,
    )
)

register_preset(
    Preset(
        name="sgt",
        paper=f"{_PAPER}: Success-Gated Transfer",
        catalog_id="001-11",
        peers=PeerSharing("rescue"),
        notes="on prompts where none of the policy's responses is verified (the rescue set) "
        "the peers' verified successes join the group and are trained on as they are (no "
        "importance weight): the score direction toward verified peer successes",
        **_PG,
    )
)
