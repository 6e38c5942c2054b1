"""Vector rewards: each reward function's component ``[N, K]`` and their weights, for
estimators that read the vector (vpo, rdpo); the others get the weighted sum."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.core.contract import Input
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class VectorRewardsProvider(InputProvider):
    name = "vector_rewards"
    order = 15
    provides = frozenset({Input.VECTOR_REWARDS})
    hint = "set two or more reward.funcs, e.g. reward.funcs='[{name: correct}, {name: format}]'"

    @classmethod
    def available(cls, cfg: Any) -> bool:
        return len(cfg.reward.funcs) >= 2

    def provide(self, step: Any) -> None:
        step[Role.REWARDS] = step.col.components
        step[Role.REWARD_WEIGHTS] = torch.tensor(list(self.trainer.scorer.weights.values()))
