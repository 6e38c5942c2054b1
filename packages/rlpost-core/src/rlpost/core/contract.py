"""The contract between methods and trainers: a vocabulary of inputs and of couplings.

Every registry entry declares, where it is registered, which inputs it reads beyond its
registry's base ones and how it couples the rows of a batch::

    @OBJECTIVES.register("lpo", LPOParams, needs={Input.GROUP_IDS}, coupling=Coupling.GROUP)

* ``needs``: inputs the entry cannot run without (a trainer that cannot provide one is
  refused at config load, naming the entry and the input);
* ``reads``: inputs it uses when present (e.g. ``mu_grpo`` takes an explicit trigger
  position, else finds one itself);
* ``coupling``: whether its output for a row depends on that row alone (``ROW``), on the
  rows sharing its prompt (``GROUP``) or on the whole batch (``BATCH``). Coupling decides
  how a trainer may split a batch into micro-batches and across ranks.

Either may be a callable of the entry's params when it depends on them (``gate_dpo``
needs whatever its base loss needs). A trainer declares the :class:`Input` s it provides
and checks a recipe against them with :meth:`rlpost.core.presets.Recipe.check`. Entries
only ever *see* the inputs they declared: :class:`rlpost.core.registry.Bound` hides the
others (sets them to ``None``), so reading an undeclared input cannot go unnoticed, and the
contract tests fill undeclared inputs with values that raise on use.

Adding a new kind of input (teacher log-probs, say) is one member here, one field on the
registry's input dataclass, and the trainers that can provide it; no method name appears
anywhere outside its registration.

Beside the inputs, a second small vocabulary, :class:`Property`, says what a trainer's
components (rollout sources, engines, parallel modes, step hooks, couplings) require of a
step and what they break; :func:`check_compatible` refuses a combination naming both
parties, so no trainer keeps tables of which options may be combined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any


class Input(StrEnum):
    """Named inputs an entry may read beyond its registry's base ones."""

    MASK = "mask"  # [B, T] response-token mask (advantage estimators that need lengths)
    VALUES = "values"  # [B, T] critic values V(s_t)
    VECTOR_REWARDS = "vector_rewards"  # [B, K] reward components (+ weights, active mask)
    BEHAVIOUR_LOGPROBS = "behaviour_logprobs"  # [B, T] log-probs of the sampled tokens
    PROMPT_FEATURES = "prompt_features"  # [B, D] embeddings of each row's prompt
    COMPLETION_FEATURES = "completion_features"  # [B, D] embeddings of each completion
    TURNS = "turns"  # [B, T] turn index of each token and [B, U] per-turn signals
    DYNAMICS = "dynamics"  # TrainingDynamics: progress, current and initial entropy
    ROLLOUT_LOGPROBS = "rollout_logprobs"  # [B, T] the rollout engine's own log-probs
    TOKEN_DISTS = "token_dists"  # [B, T, K] both policies' top-K (or full) distributions
    ADVANTAGES = "advantages"  # [B] / [B, T] advantages (ratio / KL entries; the recipe's)
    REF_LOGPROBS = "ref_logprobs"  # log-probs of a frozen reference policy
    REF_ENTROPY = "ref_entropy"  # [B, T] entropy of the reference at each position
    ENTROPY = "entropy"  # [B, T] entropy of the current policy at each position
    CLIP_RANGE = "clip_range"  # [B, T] per-token clip half-width (an advantage's output)
    GROUP_IDS = "group_ids"  # [B] prompt labels
    TRIGGER_POS = "trigger_pos"  # [B] per-response trigger token (-1: none)
    TOKEN_WEIGHTS = "token_weights"  # [B, T] detached per-token loss weights
    LENGTHS = "lengths"  # [B] response lengths (preference losses)
    GENERATION_BUDGET = "generation_budget"  # max new tokens per response (Dr. GRPO's constant)
    AUX_GRADIENTS = "aux_gradients"  # [M, D] gradients on an auxiliary data set
    GRAD_SAMPLES = "grad_samples"  # [K, D] per-micro-batch samples of the step gradient
    PARAMETERS = "parameters"  # [D] the current parameters, flat
    TASK_BOUNDARY = "task_boundary"  # a task of a continual sequence starts / ends
    TEACHER_LOGPROBS = "teacher_logprobs"  # [B, T] a teacher's log-probs of the sampled tokens
    TEACHER_TOPK = "teacher_topk"  # [B, T, K] student and teacher over the teacher's top-K ids
    TEACHER_FULL = "teacher_full"  # [B, T, V] student and teacher over the whole vocabulary
    TEACHER_SPANS = "teacher_spans"  # [B, T] text block of each token (cross-tokenizer teachers)
    REF_VELOCITY = "ref_velocity"  # [B, ...] a frozen reference flow's velocity, same points
    SAMPLING_VELOCITY = "sampling_velocity"  # [B, ...] the sampling flow's velocity (pre-update)


class Coupling(IntEnum):
    """How an entry's per-row output depends on the other rows (ordered: ROW < GROUP < BATCH).

    ``ROW``: each row alone, so any split of the batch is exact. ``GROUP``: the rows that
    share a prompt, so micro-batches and ranks must hold whole groups. ``BATCH``: a
    statistic of every row passed in, so the whole step batch must be one call.
    """

    ROW = 0
    GROUP = 1
    BATCH = 2

    def __str__(self) -> str:
        return self.name.lower()


class ContractError(ValueError):
    """A recipe needs an input its trainer does not provide, or an entry read an input it
    did not declare."""


class Property(StrEnum):
    """What a training step ordinarily guarantees, and a component may need or take away.

    A component (a rollout source, an engine, a parallel mode, a step hook, an input
    provider, a loss entry's coupling) declares the properties it *requires* and those it
    *breaks*, each with the reason in its own words (:class:`Declares`). One generic check,
    :func:`conflicts`, finds every component that breaks what another requires and names
    both: a new component is checked against all others without a table of pairs.
    """

    WHOLE_BATCH = "whole_batch"  # the update sees the step's whole batch at once
    WHOLE_GROUPS = "whole_groups"  # each micro-batch and rank holds whole groups
    EVEN_GROUPS = "even_groups"  # every group has group_size responses
    ONE_PROCESS = "one_process"  # the learner runs in one process
    UNSHARDED = "unsharded"  # the policy's weights are whole in this process
    FULL_WEIGHTS = "full_weights"  # every weight of the policy trains (no adapters)
    SAME_THREAD = "same_thread"  # rollouts are generated on the trainer's thread, between updates
    PER_STEP = "per_step"  # each step generates its own rollouts
    ONE_ROUND = "one_round"  # a step's groups are sampled in one round
    SINGLE_TURN = "single_turn"  # a rollout is one completion of one prompt
    GROUPS_ON_DEMAND = "groups_on_demand"  # any number of plain groups can be generated on request
    SINGLE_TASK = "single_task"  # the prompts come from one task stream
    VERIFIER_FEEDBACK = "verifier_feedback"  # the task's verifier can explain a failure
    TORCH_ENGINE = "torch_engine"  # the rollout engine runs rlpost's torch models
    IN_PROCESS_ENGINE = "in_process_engine"  # the rollout engine runs in this process
    STOCK_ENGINE = "stock_engine"  # the rollout engine is a stock lean / hf one
    ONE_POLICY = "one_policy"  # the run trains one policy


@dataclass(frozen=True)
class Declares:
    """A component's side of :class:`Property`: ``requires`` and ``breaks`` map each
    property to the reason, a verb phrase completing the component's name ("reads the
    whole step batch", "trains each complete group as it arrives")."""

    requires: Mapping[Property, str] = field(default_factory=dict)
    breaks: Mapping[Property, str] = field(default_factory=dict)

    def __or__(self, other: Declares) -> Declares:
        return Declares({**self.requires, **other.requires}, {**self.breaks, **other.breaks})


@dataclass(frozen=True)
class Party:
    """One component taking part in a run, by the name a user knows it by
    (``"train.pipeline rolloutpipe"``, ``"advantage estimator 'reinforce_pp'"``)."""

    name: str
    declares: Declares


@dataclass(frozen=True)
class Switch:
    """A party a configuration switches on (a section set, a value chosen): present when
    ``on(cfg)`` holds. ``example``: overrides that switch it on (what tests use)."""

    name: str
    on: Callable[[Any], bool]
    declares: Declares
    example: tuple[str, ...] = ()

    @classmethod
    def declare(
        cls,
        name: str,
        on: Callable[[Any], bool],
        *,
        requires: Mapping[Property, str] | None = None,
        breaks: Mapping[Property, str] | None = None,
        example: Iterable[str] = (),
    ) -> Switch:
        return cls(name, on, Declares(dict(requires or {}), dict(breaks or {})), tuple(example))


def conflicts(parties: Iterable[Party]) -> list[str]:
    """Every pair where one party breaks a property another requires, as
    ``"<breaker> <why>; <requirer> <why>"``, in the parties' order."""
    parties = list(parties)
    out = []
    for a in parties:
        for prop, broken in a.declares.breaks.items():
            for b in parties:
                if b.name != a.name and prop in b.declares.requires:
                    out.append(f"{a.name} {broken}; {b.name} {b.declares.requires[prop]}")
    return out


def check_compatible(parties: Iterable[Party]) -> None:
    """Raise :class:`ContractError` naming both parties of every conflict (one line)."""
    found = conflicts(parties)
    if found:
        raise ContractError(" | ".join(dict.fromkeys(found)))


__all__ = [
    "ContractError",
    "Coupling",
    "Declares",
    "Input",
    "Party",
    "Property",
    "Switch",
    "check_compatible",
    "conflicts",
]
