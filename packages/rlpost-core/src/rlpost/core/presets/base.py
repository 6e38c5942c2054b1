"""Presets: a paper's recipe as a combination of registry entries and hyper-parameters.

A :class:`Preset` names one entry (with parameters) per registry plus the scalars that
combine them (KL coefficient and placement, entropy bonus, group size, dynamic
sampling) and the trainer schedules a method prescribes (Mu-GRPO's generation stages,
REVA-PO's validation-anchored reset). ``Preset.build()`` validates every choice and
returns a :class:`Recipe`, whose :meth:`Recipe.policy_loss` is the one call a trainer
makes per micro-batch, with one :class:`PolicyBatch` of tensors by role:

    log_ratio  = RATIOS[ratio](logp, old_logp, mask)
    w, mask'   = CORRECTIONS[correction](old_logp, rollout_logp, mask)
    l_tok      = OBJECTIVES[objective](logp, old_logp, A, mask', log_ratio, w)
               + kl_coef * KL[kl](logp, ref_logp)        (when the KL is in the loss)
               - entropy_coef * H                          (entropy bonus)
               + w_d(t) * DISTILL_ESTIMATORS[distill](logp, teacher)   (on-policy distillation)
    loss       = AGGREGATIONS[aggregation](l_tok, mask', global counts)

With a distillation estimator the objective's term is weighted by ``w_rl(t)`` and the
reverse KL to the teacher by ``w_d(t)``: the preset's :class:`DistillSchedule` (constant,
or ATOD's anneal from OPD to RL over training progress ``t``). Pure OPD has ``w_rl = 0``.

The recipe is also the trainer's side of the contract (:mod:`rlpost.core.contract`):
:meth:`Recipe.needs` lists each input the chosen entries need and who needs it,
:meth:`Recipe.coupling` how far the loss couples rows, and :meth:`Recipe.check` refuses a
trainer that cannot provide a needed input, naming the entry and the input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlpost.core.advantages import ADVANTAGES, AdvantageInput, AdvantageOutput, TrainingDynamics
from rlpost.core.aggregation import AGGREGATIONS, AggregationInput
from rlpost.core.contract import ContractError, Coupling, Input
from rlpost.core.distill import (
    DISTILL_ESTIMATORS,
    DistillInput,
    DistillSchedule,
    TeacherDistributions,
    TurnReweight,
    distill_rows,
    turn_weights,
)
from rlpost.core.kl import KL_ESTIMATORS, KLInput
from rlpost.core.masked import masked_mean
from rlpost.core.objectives import OBJECTIVES, ObjectiveInput
from rlpost.core.peers import PeerSharing
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
class PolicyBatch:
    """One micro-batch's tensors by role, the single argument of :meth:`Recipe.policy_loss`.

    Shapes ``[B, T]`` (``B`` responses, ``T`` response tokens) unless noted. The first
    four are always needed; the others only by the entries that declare them (pass what
    your trainer has: entries never see inputs they did not declare).

    * ``logp``: log pi_theta of the sampled tokens (differentiable);
    * ``old_logp``: log pi_old, the behaviour policy as the trainer computes it (on-policy:
      ``logp.detach()``);
    * ``advantages``: ``[B]`` or ``[B, T]``; ``mask``: response-token mask;
    * ``rollout_logp``: the rollout engine's own log-probs (importance corrections);
    * ``ref_logp`` / ``ref_entropy``: log-probs and per-position entropy of the reference;
    * ``entropy``: per-position entropy of the current policy (bonus, logging);
    * ``clip_range``: per-token clip half-width (``AdvantageOutput.clip_range``);
    * ``token_weights``: detached per-token weights multiplying the correction weights (so
      they scale the policy-gradient term only); compute them on the whole step's batch,
      then slice, to keep micro-batching exact;
    * ``group_ids`` ``[B]`` prompt labels; ``trigger_pos`` ``[B]`` trigger token (-1: none);
    * ``token_dists``: per-token distributions of both policies (``[B, T, K]``);
    * ``dynamics``: :class:`TrainingDynamics` (progress; curriculum-scheduled objectives);
    * ``global_tokens`` / ``global_sequences``: valid tokens / responses of the *whole*
      step's batch, so that summed micro-batch gradients equal the full-batch gradient;
    * ``generation_budget``: the maximum new tokens per response (Dr. GRPO's constant);
    * ``teacher_logp`` ``[B, T]``: a teacher's log-probs of the sampled tokens;
      ``teacher_topk`` / ``teacher_full``: the student (differentiable) and the teacher
      over the teacher's top-K ids / the vocabulary (on-policy distillation);
      ``teacher_mask`` ``[B, T]``: where the teacher's signal applies (routing, row
      filters; default everywhere the mask is); ``teacher_spans`` ``[B, T]``: each token's
      text block when a teacher tokenised differently (``sampled`` estimator);
    * ``turn_ids`` ``[B, T]``: turn index of each token (-1: not a policy token), for
      turn-level reweighting (ATOD's T-DUR); without it each response is one turn;
    * ``kl_scale`` ``[B]``: a per-row multiplier of ``kl_coef`` on the KL in the loss
      (ASTOR's per-task KL coefficients); default 1.
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    rollout_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    ref_entropy: Tensor | None = None
    entropy: Tensor | None = None
    clip_range: Tensor | None = None
    token_weights: Tensor | None = None
    group_ids: Tensor | None = None
    trigger_pos: Tensor | None = None
    token_dists: TokenDistributions | None = None
    dynamics: TrainingDynamics | None = None
    global_tokens: float | None = None
    global_sequences: float | None = None
    generation_budget: float | None = None
    teacher_logp: Tensor | None = None
    teacher_topk: TeacherDistributions | None = None
    teacher_full: TeacherDistributions | None = None
    teacher_mask: Tensor | None = None
    teacher_spans: Tensor | None = None
    turn_ids: Tensor | None = None
    kl_scale: Tensor | None = None

    def __post_init__(self) -> None:
        tw = self.token_weights
        if tw is not None and tw.shape != self.logp.shape:
            raise ValueError(
                f"token_weights must be [B, T] {tuple(self.logp.shape)}, got {tuple(tw.shape)}"
            )


#: where each input a loss entry may need lives on :class:`PolicyBatch`
BATCH_FIELDS: dict[Input, str] = {
    Input.ROLLOUT_LOGPROBS: "rollout_logp",
    Input.REF_LOGPROBS: "ref_logp",
    Input.REF_ENTROPY: "ref_entropy",
    Input.ENTROPY: "entropy",
    Input.CLIP_RANGE: "clip_range",
    Input.TOKEN_WEIGHTS: "token_weights",
    Input.GROUP_IDS: "group_ids",
    Input.TRIGGER_POS: "trigger_pos",
    Input.TOKEN_DISTS: "token_dists",
    Input.DYNAMICS: "dynamics",
    Input.GENERATION_BUDGET: "generation_budget",
    Input.TEACHER_LOGPROBS: "teacher_logp",
    Input.TEACHER_TOPK: "teacher_topk",
    Input.TEACHER_FULL: "teacher_full",
    Input.TURNS: "turn_ids",
    Input.TEACHER_SPANS: "teacher_spans",
}
# produced inside the recipe itself: the advantages it passes to ratio / KL entries
_INTERNAL = frozenset({Input.ADVANTAGES})

#: ``Preset.distill_tokens``: every response token, or the actions of the search turns.
DISTILL_TOKENS = ("all", "queries")


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
    distill: Bound | None = None

    # ------------------------------------------------------------------ the contract
    @property
    def kl_in_loss(self) -> bool:
        p = self.preset
        return self.kl is not None and p.kl_coef > 0 and not p.kl_in_reward

    @property
    def kl_in_reward(self) -> bool:
        p = self.preset
        return self.kl is not None and p.kl_coef > 0 and p.kl_in_reward

    def loss_entries(self) -> tuple[Bound, ...]:
        """The entries :meth:`policy_loss` calls (per micro-batch)."""
        kl = (self.kl,) if self.kl_in_loss and self.kl is not None else ()
        distill = (self.distill,) if self.distill is not None else ()
        return (self.ratio, self.correction, self.objective, *kl, *distill, self.aggregation)

    def entries(self) -> tuple[Bound, ...]:
        return (self.advantage, *self.loss_entries())

    def _query_tokens_need(self) -> str:
        return f"preset {self.preset.name!r}'s query-token distillation"

    def _declared(self, attr: str) -> dict[Input, list[str]]:
        out: dict[Input, list[str]] = {}
        for e in self.entries():
            for i in getattr(e, attr):
                if i not in _INTERNAL:
                    out.setdefault(i, []).append(str(e))
        if self.kl is not None and self.preset.kl_coef > 0:
            out.setdefault(Input.REF_LOGPROBS, []).append(f"the KL term ({self.kl})")
        if self.preset.entropy_coef != 0:
            out.setdefault(Input.ENTROPY, []).append(f"preset {self.preset.name!r}'s entropy bonus")
        if self.distill is not None and self.preset.distill_schedule.needs_progress:
            out.setdefault(Input.DYNAMICS, []).append(
                f"preset {self.preset.name!r}'s distillation schedule"
            )
        if self.distill is not None and self.preset.distill_tokens == "queries":
            out.setdefault(Input.TURNS, []).append(self._query_tokens_need())
        if self.distill is not None and self.preset.distill_turns is not None:
            who = f"preset {self.preset.name!r}'s turn reweighting (T-DUR)"
            out.setdefault(Input.ENTROPY, []).append(who)
            if attr == "reads":  # optional: without turns each response is one turn
                out.setdefault(Input.TURNS, []).append(who)
        return out

    def distill_weights(self, dynamics: TrainingDynamics | None) -> tuple[float, float]:
        """``(w_distill, w_rl)`` now: the schedule's at the training progress (no
        distillation: ``(0, 1)``)."""
        if self.distill is None:
            return 0.0, 1.0
        progress = dynamics.progress if dynamics is not None else None
        return self.preset.distill_schedule.weights(progress)

    def distill_row_mask(self, correct: Tensor) -> Tensor:
        """``[B]``: the responses the teacher's signal applies to, by the preset's row
        filter (OPSD's ``correct`` / ``incorrect``) and each one's verifier outcome."""
        return distill_rows(correct, self.preset.distill_rows)

    def needs(self) -> dict[Input, list[str]]:
        """Each input the recipe cannot run without, and the entries that need it."""
        return self._declared("needs")

    def reads(self) -> dict[Input, list[str]]:
        """Each input any entry uses (needed or optional): what a trainer should compute."""
        return self._declared("reads")

    def coupling(self) -> Coupling:
        """The strongest coupling of the per-micro-batch loss (ROW: any split is exact)."""
        return max(e.coupling for e in self.loss_entries())

    def advantage_coupling(self) -> Coupling:
        return self.advantage.coupling

    def check(
        self,
        provides: Iterable[Input],
        who: str = "this trainer",
        hints: Mapping[Input, str] | None = None,
    ) -> None:
        """Raise :class:`ContractError` naming every needed input ``who`` does not provide
        and the entries that need it (``hints``: how to make ``who`` provide an input)."""
        have = set(provides)
        missing = {i: by for i, by in self.needs().items() if i not in have}
        if missing:
            hints = hints or {}
            parts = [
                f"{', '.join(by)} needs {i}" + (f" ({hints[i]})" if i in hints else "")
                for i, by in missing.items()
            ]
            raise ContractError(
                f"preset {self.preset.name!r}: {'; '.join(parts)}, which {who} does not "
                f"provide (it provides: {', '.join(sorted(have)) or 'nothing optional'})"
            )

    # ------------------------------------------------------------------ the calls
    def advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        return self.advantage(inp)

    def policy_loss(self, batch: PolicyBatch) -> PolicyLoss:
        """Scalar loss of one micro-batch (see :class:`PolicyBatch` for its fields).

        A loss entry coupling the rows of a group (``conspo``, ``lpo``) needs whole groups
        in the call: every label of ``group_ids`` must occur exactly ``preset.group_size``
        times, else this raises (a group split across micro-batches would silently become
        two smaller groups and the summed gradients would not equal the full batch's). One
        coupling the whole batch (``ess_adaptive``) needs the whole step's batch in one call
        (checked against ``global_sequences`` when given).
        """
        b, p = batch, self.preset
        # the advantage's inputs, and the query tokens the trainer masks with, are not the
        # loss's own
        trainer_side = {str(self.advantage), self._query_tokens_need()}
        for i, by in self.needs().items():
            by = [x for x in by if x not in trainer_side]
            if by and i in BATCH_FIELDS and getattr(b, BATCH_FIELDS[i]) is None:
                raise ContractError(
                    f"preset {p.name!r}: {', '.join(by)} needs {i}: pass "
                    f"PolicyBatch.{BATCH_FIELDS[i]}"
                )
        self._check_coupling(b)
        rin = RatioInput(
            b.logp, b.old_logp, b.mask, b.rollout_logp, advantages=b.advantages, dists=b.token_dists
        )
        ratio = self.ratio(rin)
        corr = self.correction(rin)
        w = corr.weights if b.token_weights is None else corr.weights * b.token_weights.detach()
        obj = self.objective(
            ObjectiveInput(
                b.logp,
                b.old_logp,
                b.advantages,
                corr.mask,
                ratio.log_ratio,
                w,
                clip_range=b.clip_range,
                group_ids=b.group_ids,
                trigger_pos=b.trigger_pos,
                dynamics=b.dynamics,
            )
        )
        m = corr.mask
        w_d, w_rl = self.distill_weights(b.dynamics)
        tok = obj.loss if w_rl == 1.0 else w_rl * obj.loss
        metrics = {**ratio.metrics, **corr.metrics, **obj.metrics}
        if self.distill is not None:
            dm = m if b.teacher_mask is None else m * b.teacher_mask
            dout = self.distill(
                DistillInput(
                    b.logp, dm, b.teacher_logp, b.teacher_topk, b.teacher_full, b.teacher_spans
                )
            )
            dloss = dout.loss
            if p.distill_turns is not None:
                assert b.entropy is not None  # a declared need, checked above
                tw = turn_weights(dout.kl, b.entropy, dm, b.turn_ids, p.distill_turns)
                dloss = dloss * tw
                metrics["distill/turn_weight_max"] = float(tw.max()) if tw.numel() else 0.0
            tok = tok + w_d * dloss
            metrics["distill/kl"] = masked_mean(dout.kl, dm).item() if dm.any() else 0.0
            metrics["distill/tokens"] = float(dm.sum())
            metrics["distill/weight"] = w_d
            metrics["distill/rl_weight"] = w_rl
        if self.kl_in_loss and self.kl is not None:
            kin = KLInput(b.logp, b.ref_logp, m, advantages=b.advantages, ref_entropy=b.ref_entropy)
            kl = self.kl(kin).kl
            tok = tok + p.kl_coef * (kl if b.kl_scale is None else kl * b.kl_scale[:, None])
            metrics["kl"] = masked_mean(kl.detach(), m).item()
        if p.entropy_coef != 0:
            tok = tok - p.entropy_coef * b.entropy * m
        if b.entropy is not None:
            metrics["entropy"] = masked_mean(b.entropy.detach(), m).item()
        agg = self.aggregation(
            AggregationInput(tok, m, b.global_tokens, b.global_sequences, b.generation_budget)
        )
        return PolicyLoss(agg.loss, metrics)

    def _check_coupling(self, b: PolicyBatch) -> None:
        c, p = self.coupling(), self.preset
        if c == Coupling.GROUP and b.group_ids is not None and b.group_ids.numel():
            labels, counts = b.group_ids.unique(return_counts=True)
            if (counts != p.group_size).any():
                bad = (counts != p.group_size).nonzero().flatten()[:5]
                raise ValueError(
                    f"group_ids: group(s) {labels[bad].tolist()} have {counts[bad].tolist()} "
                    f"responses in this micro-batch, preset {p.name!r} has group_size "
                    f"{p.group_size}: split micro-batches on group boundaries (whole groups)"
                )
        if c == Coupling.BATCH and b.global_sequences is not None:
            rows = int((b.mask.sum(1) > 0).sum())
            if rows < b.global_sequences:
                who = [str(e) for e in self.loss_entries() if e.coupling == Coupling.BATCH]
                raise ValueError(
                    f"{', '.join(who)} reads a statistic of the whole step batch, but this call "
                    f"holds {rows} of its {b.global_sequences:g} responses: pass the whole "
                    "batch in one policy_loss call"
                )


@dataclass(frozen=True)
class Preset:
    """A named recipe citing its paper; see the module docstring for how it composes.

    ``rollout``: the rollout sources the method prescribes, by their names in the LLM
    trainer's registry (:mod:`rlpost.llm.rollout.sources`): DAPO's refill rounds
    (``Choice("dynamic_sampling")``), Mu-GRPO's few large generation-optimisation stages
    (000-17, ``Choice("stages", {"stages": 4})``), FBOS-RL's feedback-guided re-rollouts
    (000-15, ``Choice("feedback", <rlpost.core.feedback.FeedbackExploration fields>)``).
    ``hooks``: the step hooks it prescribes around the update (REVA-PO's VAPR, 004-09:
    ``Choice("validation_reset")``, :mod:`rlpost.llm.train.hooks`). A trainer validates
    both against its registries when it loads a config, so the core keeps no list of
    them.

    ``distill``: a ``DISTILL_ESTIMATORS`` entry (reverse KL to a teacher on the student's
    own rollouts; the teacher is the trainer's), weighted against the objective by
    ``distill_schedule``; ``distill_rows``: the responses distilled (all, correct,
    incorrect: OPSD's filters, 001-16); ``distill_turns``: ATOD's turn-level
    disagreement-uncertainty reweighting of the distillation term (004-27);
    ``distill_tokens``: the tokens distilled, ``all`` or ``queries`` (the actions of the
    turns that searched, SD-Search's query positions, 000-16; the trainer restricts
    ``PolicyBatch.teacher_mask`` to them and needs multi-turn episodes, ``Input.TURNS``).

    ``peers``: the policy trains beside heterogeneous peers answering the same prompts
    and uses their responses as :class:`~rlpost.core.peers.PeerSharing` says (Mutual RL's
    PRP, XGRPO, SGT; 001-11); the trainer supplies them.
    """

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
    rollout: tuple[Choice, ...] = ()
    hooks: tuple[Choice, ...] = ()
    distill: Choice | None = None
    distill_schedule: DistillSchedule = field(default_factory=DistillSchedule)
    distill_rows: str = "all"
    distill_turns: TurnReweight | None = None
    distill_tokens: str = "all"
    peers: PeerSharing | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"preset {self.name!r}: kl_coef must be >= 0")
        if self.kl_coef > 0 and self.kl is None:
            raise ValueError(f"preset {self.name!r}: kl_coef > 0 needs a kl estimator")
        if self.group_size < 1:
            raise ValueError(f"preset {self.name!r}: group_size must be >= 1")
        for c in (*self.rollout, *self.hooks):
            if not isinstance(c, Choice):
                raise TypeError(f"preset {self.name!r}: rollout and hooks hold Choice(...)s")
        distill_rows(torch.zeros(1, dtype=torch.bool), self.distill_rows)  # validates
        if self.distill_tokens not in DISTILL_TOKENS:
            raise ValueError(
                f"preset {self.name!r}: distill_tokens must be one of {', '.join(DISTILL_TOKENS)}"
            )

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
            bind(DISTILL_ESTIMATORS, self.distill) if self.distill is not None else None,
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
