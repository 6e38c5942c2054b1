"""Presets: a paper's recipe as a combination of registry entries and hyper-parameters.

A :class:`Preset` names one entry (with parameters) per registry plus the scalars that
combine them (KL coefficient and placement, entropy bonus, group size, dynamic
sampling). ``Preset.build()`` validates every choice and returns a :class:`Recipe`,
whose :meth:`Recipe.policy_loss` is the one call a trainer makes per micro-batch:

    log_ratio  = RATIOS[ratio](logp, old_logp, mask)
    w, mask'   = CORRECTIONS[correction](old_logp, rollout_logp, mask)
    l_tok      = OBJECTIVES[objective](logp, old_logp, A, mask', log_ratio, w)
               + kl_coef * KL[kl](logp, ref_logp)        (when the KL is in the loss)
               - entropy_coef * H                          (entropy bonus)
    loss       = AGGREGATIONS[aggregation](l_tok, mask', global counts)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import Tensor

from rlpost.core.advantages import ADVANTAGES, AdvantageInput, AdvantageOutput
from rlpost.core.aggregation import AGGREGATIONS, AggregationInput
from rlpost.core.kl import KL_ESTIMATORS, KLInput
from rlpost.core.masked import masked_mean
from rlpost.core.objectives import GROUP_OBJECTIVES, OBJECTIVES, ObjectiveInput
from rlpost.core.ratios import CORRECTIONS, RATIOS, RatioInput, TokenDistributions
from rlpost.core.registry import Bound, RegistryError


@dataclass(frozen=True)
class Choice:
    """One registry entry and its parameters, e.g. ``Choice("ppo_clip", {"clip_high": 0.28})``."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


class PolicyLoss(NamedTuple):
    loss: Tensor  # scalar to backpropagate (already globally normalised)
    metrics: dict[str, float]


@dataclass(frozen=True)
class Recipe:
    """Bound registry entries of a validated preset."""

    preset: Preset
    advantage: Bound
    ratio: Bound
    correction: Bound
    objective: Bound
    aggregation: Bound
    kl: Bound | None

    def advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        return self.advantage(inp)

    def policy_loss(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        rollout_logp: Tensor | None = None,
        ref_logp: Tensor | None = None,
        ref_entropy: Tensor | None = None,
        entropy: Tensor | None = None,
        global_tokens: float | None = None,
        global_sequences: float | None = None,
        clip_range: Tensor | None = None,
        token_weights: Tensor | None = None,
        group_ids: Tensor | None = None,
        trigger_pos: Tensor | None = None,
        token_dists: TokenDistributions | None = None,
    ) -> PolicyLoss:
        """Scalar loss of one micro-batch, shapes ``[B, T]`` (advantages ``[B]`` or ``[B, T]``).

        Pass ``global_tokens`` / ``global_sequences`` of the whole step's batch so that
        summing the micro-batch gradients reproduces the full-batch gradient.
        ``clip_range``: per-token clip half-width (``AdvantageOutput.clip_range``), read by
        objectives that take one (``ppo_clip_turn``) and ignored by the others.
        ``token_weights``: detached per-token weights multiplying the correction weights,
        so they scale the policy-gradient term only (not the KL or entropy terms); compute
        them on the whole step's batch, then slice, to keep micro-batching exact.
        ``group_ids`` ``[B]``: prompt labels, read by group-level objectives (``conspo``,
        ``lpo``). Their loss couples the responses of a group, so a micro-batch must hold
        whole groups: every label present must occur exactly ``preset.group_size`` times,
        else this raises (a group split across micro-batches would silently become two
        smaller groups and the summed gradients would not equal the full batch's). The
        check runs only for the objectives in ``GROUP_OBJECTIVES``; the others ignore
        ``group_ids``. ``ref_entropy`` ``[B, T]``: entropy of pi_ref per position, passed
        to the KL estimator (read by response-weighted KLs such as ``reva_rer``).
        ``trigger_pos`` ``[B]``: per-response trigger token index (-1: none) for
        ``mu_grpo``'s negative-advantage veto; row-wise, so any split is exact.
        ``token_dists``: per-token distributions ``[B, T, K]`` of both policies (engine
        top-K or full), read by ``predictive_divergence_mask``; row-wise, split exactly.
        """
        p = self.preset
        rin = RatioInput(
            logp, old_logp, mask, rollout_logp, advantages=advantages, dists=token_dists
        )
        ratio = self.ratio(rin)
        corr = self.correction(rin)
        if token_weights is not None and token_weights.shape != logp.shape:
            raise ValueError(
                f"token_weights must be [B, T] {tuple(logp.shape)}, "
                f"got {tuple(token_weights.shape)}"
            )
        w = corr.weights if token_weights is None else corr.weights * token_weights.detach()
        if group_ids is not None and group_ids.numel() and p.objective.name in GROUP_OBJECTIVES:
            labels, counts = group_ids.unique(return_counts=True)
            if (counts != p.group_size).any():
                bad = (counts != p.group_size).nonzero().flatten()[:5]
                raise ValueError(
                    f"group_ids: group(s) {labels[bad].tolist()} have {counts[bad].tolist()} "
                    f"responses in this micro-batch, preset {p.name!r} has group_size "
                    f"{p.group_size}: split micro-batches on group boundaries (whole groups)"
                )
        obj = self.objective(
            ObjectiveInput(
                logp,
                old_logp,
                advantages,
                corr.mask,
                ratio.log_ratio,
                w,
                clip_range=clip_range,
                group_ids=group_ids,
                trigger_pos=trigger_pos,
            )
        )
        tok = obj.loss
        metrics = {**ratio.metrics, **corr.metrics, **obj.metrics}
        m = corr.mask
        if self.kl is not None and p.kl_coef > 0 and not p.kl_in_reward:
            if ref_logp is None:
                raise ValueError(f"preset {p.name!r} puts a KL in the loss: pass ref_logp")
            kl = self.kl(
                KLInput(logp, ref_logp, m, advantages=advantages, ref_entropy=ref_entropy)
            ).kl
            tok = tok + p.kl_coef * kl
            metrics["kl"] = masked_mean(kl.detach(), m).item()
        if p.entropy_coef != 0:
            if entropy is None:
                raise ValueError(f"preset {p.name!r} has an entropy bonus: pass entropy")
            tok = tok - p.entropy_coef * entropy * m
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy.detach(), m).item()
        agg = self.aggregation(AggregationInput(tok, m, global_tokens, global_sequences))
        return PolicyLoss(agg.loss, metrics)


@dataclass(frozen=True)
class Preset:
    """A named recipe citing its paper; see the module docstring for how it composes."""

    name: str
    paper: str
    catalog_id: str
    advantage: Choice
    objective: Choice
    aggregation: Choice
    ratio: Choice = Choice("token")
    correction: Choice = Choice("none")
    kl: Choice | None = None
    kl_coef: float = 0.0
    kl_in_reward: bool = False  # True: -kl_coef * KL enters the token rewards instead
    entropy_coef: float = 0.0
    group_size: int = 8
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, refill
    notes: str = ""

    def __post_init__(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"preset {self.name!r}: kl_coef must be >= 0")
        if self.kl_coef > 0 and self.kl is None:
            raise ValueError(f"preset {self.name!r}: kl_coef > 0 needs a kl estimator")
        if self.group_size < 1:
            raise ValueError(f"preset {self.name!r}: group_size must be >= 1")

    def replace(self, **changes: Any) -> Preset:
        return dataclasses.replace(self, **changes)

    def build(self) -> Recipe:
        def bind(reg, c: Choice) -> Bound:
            return reg.build(c.name, **dict(c.params))

        return Recipe(
            self,
            bind(ADVANTAGES, self.advantage),
            bind(RATIOS, self.ratio),
            bind(CORRECTIONS, self.correction),
            bind(OBJECTIVES, self.objective),
            bind(AGGREGATIONS, self.aggregation),
            bind(KL_ESTIMATORS, self.kl) if self.kl is not None else None,
        )


PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset) -> Preset:
    if preset.name in PRESETS:
        raise RegistryError(f"preset {preset.name!r} is already registered")
    preset.build()  # validate every choice now, not at training time
    PRESETS[preset.name] = preset
    return preset


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise RegistryError(
            f"unknown preset {name!r}; valid names: {', '.join(sorted(PRESETS))}"
        ) from None


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
        dynamic_sampling=True,
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
        aggregation=Choice("constant", {"normalizer": 3000.0}),
        group_size=8,
        notes="no std scaling, constant normaliser = generation budget (3000 tokens in the paper; "
        "set it to your max_new_tokens), no KL",
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
