"""What every step has: the rollout mask, group labels, the engine's log-probs of the
sampled tokens, the rewards, the generation budget; the training forward's entropy and
the estimator's per-token clip range. The loss mask leaves out responses cut by
``max_new_tokens`` (``train.overlong_mask``; they still count in the advantages)."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.core.contract import Input
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class BatchProvider(InputProvider):
    name = "batch"
    order = 10
    provides = frozenset(
        {
            Input.MASK,
            Input.GROUP_IDS,
            Input.ROLLOUT_LOGPROBS,
            Input.BEHAVIOUR_LOGPROBS,
            Input.GENERATION_BUDGET,
            Input.ENTROPY,  # the training forward's, every micro-batch
            Input.CLIP_RANGE,  # whatever the advantage estimator returns
        }
    )

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        return True

    def provide(self, step: Any) -> None:
        col, b = step.col, step.batch
        truncated = torch.tensor([r == "length" for r in b.finish_reasons])
        step[Role.TRUNCATED] = truncated
        if self.trainer.cfg.train.overlong_mask:
            step.mask[truncated] = 0.0
        step[Role.REWARDS] = col.rewards
        step[Input.GROUP_IDS] = b.group
        step[Input.ROLLOUT_LOGPROBS] = b.logprobs
        step[Input.BEHAVIOUR_LOGPROBS] = b.logprobs * b.mask
        step[Input.GENERATION_BUDGET] = float(self.trainer.cfg.rollout.max_new_tokens)
        if col.old_logp is not None:  # Mu-GRPO: the stage's behaviour policy
            step[Role.OLD_LOGP] = col.old_logp

    def advantaged(self, step: Any, out: Any) -> None:
        if out.clip_range is not None:
            step[Input.CLIP_RANGE] = out.clip_range
