"""The frozen reference policy (the KL term): its log-probs of the sampled tokens and,
when an entry reads it, its per-position entropy. With the KL in the reward it also
turns the recipe's KL estimator (its params honoured) into dense token rewards."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Input
from rlpost.core.kl import kl_reward_penalty
from rlpost.llm.model.policy import Reference
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class ReferenceProvider(InputProvider):
    name = "reference"
    order = 30
    provides = frozenset({Input.REF_LOGPROBS, Input.REF_ENTROPY})

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        return recipe.kl_in_loss or recipe.kl_in_reward

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.reference = Reference(trainer.model)
        self.entropy = Input.REF_ENTROPY in trainer.reads

    def provide(self, step: Any) -> None:
        t, b = self.trainer, step.batch
        with self.reference.active(t.model) as ref:
            fwd = t.forwards.nograd(ref, b, entropy=self.entropy)
        step[Input.REF_LOGPROBS] = fwd.logp
        if fwd.entropy is not None:
            step[Input.REF_ENTROPY] = fwd.entropy
        r = t.recipe
        if r.kl_in_reward:
            coef = t.preset.kl_coef
            step[Role.TOKEN_REWARDS] = kl_reward_penalty(
                step[Role.OLD_LOGP], fwd.logp, b.mask, coef, r.kl
            )
