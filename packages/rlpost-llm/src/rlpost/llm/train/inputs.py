"""One step's inputs to the advantage estimator and the policy loss, by role.

The input providers (:mod:`rlpost.llm.train.providers`) fill a :class:`StepInputs` with
the contract's inputs (:class:`rlpost.core.contract.Input`: reference log-probs, critic
values, features, teacher scores, ...) and the trainer's own per-step values
(:class:`Role`: rewards, pi_old's log-probs, advantages, ...), each over the step's ``N``
rows. The step then fills the two registries' inputs by role, so a new input never
changes a call::

    step.advantage_input()                        -> AdvantageInput (the whole batch)
    step.policy_batch(idx, logp, entropy, fwd, n) -> PolicyBatch (micro-batch ``idx``)

Entries see only what they declared (the core's registries hide the rest), so a value
present here is harmless to an entry that does not read it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlpost.core.advantages import AdvantageInput
from rlpost.core.contract import Input
from rlpost.core.presets.base import BATCH_FIELDS, PolicyBatch


class Role(StrEnum):
    """The trainer's own per-step values beside the contract's inputs."""

    REWARDS = "rewards"  # [N] the weighted sum, or [N, K] components for vector estimators
    REWARD_WEIGHTS = "reward_weights"  # [K] with vector rewards
    OLD_LOGP = "old_logp"  # [N, L] pi_old of the sampled tokens (the trainer's forward)
    BEHAVIOUR_DISTS = "behaviour_dists"  # (ids, logp) [N, L, K]: pi_old's top-K
    TOKEN_REWARDS = "token_rewards"  # [N, L] dense rewards (the KL in the reward)
    ADVANTAGES = "advantages"  # [N, L] (or [N])
    RETURNS = "returns"  # [N, L] the critic's value targets
    TEACHER_MASK = "teacher_mask"  # [N, L] where the teacher's signal applies
    TRAINED = "trained"  # [N] bool: the rows the policy loss sees
    SKIPPED = "skipped"  # [N] bool: of those, the ones adding exactly 0 (not forwarded)
    TRUNCATED = "truncated"  # [N] bool: cut by max_new_tokens
    KL_SCALE = "kl_scale"  # [N] a per-row multiplier of kl_coef (ASTOR's per-task KL)


class Turns(NamedTuple):
    """``Input.TURNS``: each token's turn ``[N, L]`` (-1: not a policy token), each turn's
    signal ``[N, U]`` and, with a stage structure, each turn's stage ``[N, U]``."""

    ids: Tensor
    rewards: Tensor | None
    stages: Tensor | None = None


# AdvantageInput field <- step value (rewards, weights, mask and turns are filled apart)
_ADVANTAGE_FIELDS = {
    "group_ids": Input.GROUP_IDS,
    "values": Input.VALUES,
    "token_rewards": Role.TOKEN_REWARDS,
    "logprobs": Input.BEHAVIOUR_LOGPROBS,
    "prompt_features": Input.PROMPT_FEATURES,
    "completion_features": Input.COMPLETION_FEATURES,
    "dynamics": Input.DYNAMICS,
    "teacher_logprobs": Input.TEACHER_LOGPROBS,
    "reward_weights": Role.REWARD_WEIGHTS,
}
# step-wide values: never sliced by rows
_WHOLE = frozenset({Input.DYNAMICS, Input.GENERATION_BUDGET, Role.REWARD_WEIGHTS})


def rows(value: Any, idx: Tensor) -> Any:
    """``value``'s rows ``idx`` (a tensor, or each tensor of a tuple)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value[idx]
    if isinstance(value, tuple):
        return type(value)(*(rows(v, idx) for v in value))
    raise TypeError(f"cannot take rows of {type(value).__name__}")


class StepInputs:
    """``key -> value`` over one step's rows (see the module docstring). ``col``: the
    step's rollouts; ``mask``: the loss mask ``[N, L]`` (the rollout mask without the
    responses the loss leaves out)."""

    def __init__(self, col: Any, mask: Tensor):
        self.col = col
        self.batch = col.batch
        self.mask = mask
        self.values: dict[Any, Any] = {}
        self.metrics: dict[str, float] = {}  # what the providers and the estimator report

    def __setitem__(self, key: Any, value: Any) -> None:
        self.values[key] = value

    def __getitem__(self, key: Any) -> Any:
        return self.values[key]

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def get(self, key: Any, default: Any = None) -> Any:
        return self.values.get(key, default)

    def counts(self) -> tuple[float, float]:
        """Valid tokens and responses: the loss normalisers' counts."""
        return float(self.mask.sum()), float((self.mask.sum(1) > 0).sum())

    def trained_rows(self) -> Tensor:
        """The indices of the rows the policy loss sees, less those whose gradient is
        exactly zero (``Role.SKIPPED``, :mod:`rlpost.llm.train.inert`): the rows to forward."""
        rows = self.values[Role.TRAINED]
        skipped = self.values.get(Role.SKIPPED)
        return torch.nonzero(rows if skipped is None else rows & ~skipped).flatten()

    def rows_of(self, key: Any, idx: Tensor) -> Any:
        """The value of ``key`` for micro-batch rows ``idx`` (None when absent)."""
        v = self.values.get(key)
        return v if key in _WHOLE else rows(v, idx)

    # ------------------------------------------------------------------ by role
    def advantage_input(self) -> AdvantageInput:
        """The estimator's input over the whole step (the rollout mask, not the loss's)."""
        kw = {f: self.values[k] for f, k in _ADVANTAGE_FIELDS.items() if k in self.values}
        turns = self.values.get(Input.TURNS)
        if turns is not None:
            kw.update(turn_ids=turns.ids, turn_rewards=turns.rewards, turn_stages=turns.stages)
        return AdvantageInput(rewards=self.values[Role.REWARDS], mask=self.batch.mask, **kw)

    def policy_batch(
        self,
        idx: Tensor,
        logp: Tensor,
        entropy: Tensor,
        forward: dict[Any, Any],
        counts: tuple[float, float],
    ) -> PolicyBatch:
        """The loss's input for micro-batch rows ``idx``: the training forward's
        ``logp`` / ``entropy`` and extras (``forward``: per-micro-batch inputs such as
        both policies' token distributions), the step's inputs sliced, and the step's
        token / response ``counts`` as the global normalisers."""
        kw: dict[str, Any] = {}
        for key, name in BATCH_FIELDS.items():
            if key in forward:
                kw[name] = forward[key]
            elif key in self.values:
                kw[name] = self.rows_of(key, idx)
        turns = kw.pop("turn_ids", None)
        if turns is not None:
            kw["turn_ids"] = turns.ids
        kw["entropy"] = entropy
        kw["teacher_mask"] = self.rows_of(Role.TEACHER_MASK, idx)
        kw["kl_scale"] = self.rows_of(Role.KL_SCALE, idx)
        old = self.rows_of(Role.OLD_LOGP, idx)
        return PolicyBatch(
            logp,
            old if old is not None else logp.detach(),
            self.rows_of(Role.ADVANTAGES, idx),
            self.mask[idx],
            global_tokens=counts[0],
            global_sequences=counts[1],
            **kw,
        )
