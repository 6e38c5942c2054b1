"""On-policy distillation: OPD alone, OPD with the verifier's reward, MOPD, CoPD, ATOD,
OPSD, SDPO, RESD, PMD and SD-Search. The losses differ only in the weights of the two terms; who the teacher is (a
frozen model, one per domain, the policy itself with a privileged context) is the
trainer's configuration (``rlpost-llm``'s ``distill`` section)."""

from rlpost.core.distill import DistillSchedule, TurnReweight
from rlpost.core.presets.base import Choice, Preset, register_preset

_PG = {
    "advantage": Choice("grpo", {"scale_by_std": True}),
    "objective": Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
    "aggregation": Choice("token_mean"),
}
_PURE = DistillSchedule(distill_start=1.0, rl_start=0.0)  # the reward trains nothing

register_preset(
    Preset(
        name="opd",
        paper="Agarwal et al. 2024, On-Policy Distillation of Language Models (GKD), "
        "arXiv:2306.13649; Lu et al. 2025, On-Policy Distillation, Thinking Machines",
        catalog_id="base",
        distill=Choice("topk"),
        distill_schedule=_PURE,
        group_size=4,
        notes="pure OPD: per-token reverse KL to the teacher on the student's samples, the "
        "teacher's top-K exact and the tail by the sampled token; the verifier only logs",
        **_PG,
    )
)

register_preset(
    Preset(
        name="opd_rl",
        paper="OPD (Agarwal et al. 2024, arXiv:2306.13649) plus the verifier reward through "
        "GRPO (Shao et al. 2024, arXiv:2402.03300)",
        catalog_id="base",
        distill=Choice("topk"),
        distill_schedule=DistillSchedule(distill_start=1.0, rl_start=1.0),
        group_size=8,
        notes="GRPO's clipped objective on the verifier reward plus the reverse KL to the "
        "teacher, both at weight 1",
        **_PG,
    )
)

register_preset(
    Preset(
        name="mopd",
        paper="Multi-teacher On-Policy Distillation (MOPD), catalog 004-25; the routed "
        "reverse-KL objective of Mach-Mind-4-Flash, catalog 004-11",
        catalog_id="004-25",
        distill=Choice("topk"),
        distill_schedule=_PURE,
        group_size=4,
        notes="each prompt's rollouts are scored by its domain's teacher (distill.teachers "
        "with domains) under the reverse KL; rows of a domain without a teacher are not "
        "distilled",
        **_PG,
    )
)

register_preset(
    Preset(
        name="atod",
        paper="ATOD: Annealed Turn-aware On-policy Distillation, catalog 004-27",
        catalog_id="004-27",
        distill=Choice("topk"),
        distill_schedule=DistillSchedule.atod(),
        distill_turns=TurnReweight(alpha=0.5, w_max=3.0),
        group_size=8,
        notes="the distillation weight anneals 1 -> 0 and the RL weight 0 -> 1 on a cosine "
        "over training (our reading: the abstract fixes the direction, not the curve); "
        "T-DUR reweights turns by disagreement x uncertainty (one turn per response "
        "until the agents trainer provides turns)",
        **_PG,
    )
)

register_preset(
    Preset(
        name="opsd",
        paper="On-Policy Self-Distillation on thinking-enabled reasoning, catalog 001-16",
        catalog_id="001-16",
        distill=Choice("topk"),
        distill_schedule=_PURE,
        group_size=8,
        notes="the teacher is the policy itself given a privileged context (the reference "
        "answer); algo.distill_rows=correct|incorrect distils only the correct / incorrect "
        "rollouts (compression vs correction)",
        **_PG,
    )
)

register_preset(
    Preset(
        name="sdpo",
        paper="Self-Distillation Policy Optimization as the baseline of continual "
        "post-training, catalog 004-20",
        catalog_id="004-20",
        distill=Choice("topk"),
        distill_schedule=DistillSchedule(distill_start=1.0, rl_start=1.0),
        group_size=8,
        notes="the verifier's reward with GRPO plus dense self-distillation from the policy "
        "conditioned on feedback (a self teacher whose template reads distill.memory's "
        "{reflection})",
        **_PG,
    )
)

register_preset(
    Preset(
        name="resd",
        paper="Reflection-Enhanced Self-Distillation (RESD), catalog 000-26",
        catalog_id="000-26",
        distill=Choice("topk"),
        distill_schedule=_PURE,
        group_size=1,
        notes="pure self-distillation from the policy conditioned on its reflection on the "
        "failed response and a persistent playbook of lessons (distill.memory kind "
        "playbook); one rollout per prompt, as the abstract's interaction-efficiency claim",
        **_PG,
    )
)

register_preset(
    Preset(
        name="pmd",
        paper="Procedural Memory Distillation (PMD), catalog 004-22",
        catalog_id="004-22",
        distill=Choice("topk"),
        distill_schedule=DistillSchedule(distill_start=1.0, rl_start=1.0),
        group_size=8,
        notes="SDPO's loss (GRPO + self-distillation, weight 1 each) with the self-teacher "
        "conditioned on a three-level procedural memory extracted online from the rollouts "
        "(distill.memory kind procedural)",
        **_PG,
    )
)

register_preset(
    Preset(
        name="copd",
        paper="Co-Evolving Policy Distillation (CoPD), catalog 001-26",
        catalog_id="001-26",
        distill=Choice("topk"),
        distill_schedule=DistillSchedule(distill_start=1.0, rl_start=1.0),
        group_size=8,
        notes="each expert: GRPO on its own domain's verifier plus the reverse KL to its "
        "peers on theirs, the experts' weights exchanged every round (rlpost-llm's copd "
        "section runs them as Ray actors)",
        **_PG,
    )
)

register_preset(
    Preset(
        name="sd_search",
        paper="SD-Search: on-policy hindsight self-distillation for search agents, catalog 000-16",
        catalog_id="000-16",
        distill=Choice("jsd_topk"),
        distill_schedule=DistillSchedule(distill_start=1.0, rl_start=1.0),
        distill_tokens="queries",
        group_size=8,
        notes="GRPO on the outcome plus the token-level Jensen-Shannon divergence to the "
        "policy itself conditioned on a hindsight block of its group's rollouts (a self "
        "teacher with template '{hindsight}{prompt}'), at search-query tokens only; weight "
        "1 each (ours: the abstract gives none); jsd for the exact full-vocabulary form",
        **_PG,
    )
)
