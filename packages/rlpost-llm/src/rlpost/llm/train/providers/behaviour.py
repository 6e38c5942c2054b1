"""pi_old: the trainer's own no-grad forward of the behaviour policy over the sampled
tokens, when a step needs it (several updates per batch, the KL in the reward, StepOPSD's
rescoring) and its top-K distributions (``Input.TOKEN_DISTS``: both policies over the
behaviour's top-``algo.topk`` ids, the current policy's from each training forward)."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Input
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.probes import token_distributions
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class BehaviourProvider(InputProvider):
    name = "behaviour"
    order = 20
    provides = frozenset({Input.TOKEN_DISTS})

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        rescored = Input.TEACHER_LOGPROBS in recipe.advantage.reads  # StepOPSD
        several = cfg.optim.updates_per_batch > 1
        return several or recipe.kl_in_reward or Input.TOKEN_DISTS in reads or rescored

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.dists = Input.TOKEN_DISTS in trainer.reads

    def provide(self, step: Any) -> None:
        t = self.trainer
        if step.col.old_logp is not None and not self.dists:
            return  # Mu-GRPO: the stage's own log-probs (the batch provider's)
        fwd = t.forwards.nograd(t.model, step.batch, dists=self.dists)
        step[Role.OLD_LOGP] = fwd.logp
        if self.dists:
            step[Role.BEHAVIOUR_DISTS] = fwd.dists

    def forward_kwargs(self, mb: Any) -> dict[str, Any]:
        if not self.dists:
            return {}
        return {"dists": mb.step[Role.BEHAVIOUR_DISTS][0][mb.idx]}

    def from_forward(self, mb: Any, out: tuple) -> dict[Any, Any]:
        if not self.dists:
            return {}
        ids, lp = mb.step[Role.BEHAVIOUR_DISTS]
        behaviour = (ids[mb.idx], lp[mb.idx])
        return {Input.TOKEN_DISTS: token_distributions(out[2], behaviour, mb.sub.completion_ids)}
