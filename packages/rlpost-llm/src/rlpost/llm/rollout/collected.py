"""A step's rollouts as the trainer receives them from its rollout source."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.peers import OWN
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.engines.base import RolloutBatch


@dataclass
class Collected:
    batch: RolloutBatch
    examples: list[Example]  # one per row
    rewards: Tensor  # [N] weighted sum of the reward functions
    components: Tensor  # [N, K] one column per reward function (reward.funcs order)
    accuracy: Tensor  # [N] the verifier ("correct" component) solved the example
    metrics: dict[str, float]
    old_logp: Tensor | None = None  # [N, L] behaviour log-probs taken at generation (stages)
    # [N] Mutual RL: rlpost.core.peers' OWN / TRAIN / BASELINE per row (None: all own)
    roles: Tensor | None = None
    turn_ids: Tensor | None = None  # [N, L] multi-turn episodes: each token's turn (-1: env)
    turn_rewards: Tensor | None = None  # [N, U] each turn's signal (data.env.turn_signal)
    turn_stages: Tensor | None = None  # [N, U] each turn's stage (turn_signal: rubric)
    query_mask: Tensor | None = None  # [N, L] the action tokens of search turns

    def own(self) -> Tensor:
        """``[N]`` bool: the rows this policy generated itself."""
        if self.roles is None:
            return torch.ones(len(self.rewards), dtype=torch.bool)
        return self.roles == OWN

    # DORA's chunks: plain groups (the fields collect() fills), split and merged by group
    def n_groups(self) -> int:
        return int(self.batch.group.max()) + 1 if len(self.batch) else 0

    def split(self, k: int) -> tuple[Collected, Collected]:
        """The first ``k`` groups and the rest."""
        first = self.batch.group < k
        return self._rows(torch.nonzero(first).flatten()), self._rows(
            torch.nonzero(~first).flatten()
        )

    def _rows(self, rows: Tensor) -> Collected:
        return Collected(
            self.batch.select(rows),
            [self.examples[i] for i in rows.tolist()],
            self.rewards[rows],
            self.components[rows],
            self.accuracy[rows],
            dict(self.metrics),
        )

    @staticmethod
    def concat(parts: list[Collected]) -> Collected:
        """One batch of the parts' groups, in order (each part's metrics averaged, its
        rollout seconds summed)."""
        metrics: dict[str, float] = {}
        for c in parts:
            for k, v in c.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v
        for k in metrics:
            if k != "time/rollout":
                metrics[k] /= len(parts)
        return Collected(
            RolloutBatch.concat([c.batch for c in parts]),
            [e for c in parts for e in c.examples],
            torch.cat([c.rewards for c in parts]),
            torch.cat([c.components for c in parts]),
            torch.cat([c.accuracy for c in parts]),
            metrics,
        )
