"""A step's rollouts as the trainer receives them from its rollout source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


# ----------------------------------------------------------------------------- checkpoints


def batch_to_state(b: RolloutBatch, prefix: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A :class:`RolloutBatch` as safetensors-able tensors and JSON."""
    flat = [t for p in b.prompt_ids for t in p]
    lens = [len(p) for p in b.prompt_ids]
    tensors = {
        f"{prefix}.prompt_flat": torch.tensor(flat, dtype=torch.long),
        f"{prefix}.prompt_lens": torch.tensor(lens, dtype=torch.long),
        f"{prefix}.completion_ids": b.completion_ids,
        f"{prefix}.logprobs": b.logprobs,
        f"{prefix}.mask": b.mask,
        f"{prefix}.group": b.group,
    }
    for name in ("context", "versions"):
        if getattr(b, name) is not None:
            tensors[f"{prefix}.{name}"] = getattr(b, name)
    meta = {
        "finish_reasons": list(b.finish_reasons),
        "pad_id": b.pad_id,
        "policy_version": b.policy_version,
    }
    return tensors, meta


def batch_from_state(t: dict[str, Tensor], meta: dict[str, Any], prefix: str) -> RolloutBatch:
    flat, lens = t[f"{prefix}.prompt_flat"].tolist(), t[f"{prefix}.prompt_lens"].tolist()
    prompts, i = [], 0
    for n in lens:
        prompts.append(flat[i : i + n])
        i += n
    return RolloutBatch(
        prompts,
        t[f"{prefix}.completion_ids"],
        t[f"{prefix}.logprobs"],
        t[f"{prefix}.mask"],
        list(meta["finish_reasons"]),
        t[f"{prefix}.group"],
        int(meta["pad_id"]),
        int(meta["policy_version"]),
        t.get(f"{prefix}.context"),
        t.get(f"{prefix}.versions"),
    )


_OPTIONAL = ("old_logp", "roles", "turn_ids", "turn_rewards", "turn_stages", "query_mask")


class CollectedBuffer:
    """Collected batches kept across a checkpoint, oldest first: a Mu-GRPO stage's
    remaining rollouts, the one-step-off schedule's batch generated ahead. ``prefix``
    names its tensors in the checkpoint (``<prefix><i>.<field>``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: list[Collected] = []

    def __len__(self) -> int:
        return len(self.items)

    def state(self) -> tuple[dict[str, Tensor], list[dict[str, Any]]]:
        tensors: dict[str, Tensor] = {}
        metas = []
        for i, c in enumerate(self.items):
            p = f"{self.prefix}{i}"
            t, m = batch_to_state(c.batch, p)
            tensors.update(t)
            tensors[f"{p}.rewards"] = c.rewards
            tensors[f"{p}.components"] = c.components
            tensors[f"{p}.accuracy"] = c.accuracy
            for name in _OPTIONAL:
                if getattr(c, name) is not None:
                    tensors[f"{p}.{name}"] = getattr(c, name)
            m["examples"] = [[e.prompt, e.answer, e.meta] for e in c.examples]
            m["metrics"] = c.metrics
            metas.append(m)
        return tensors, metas

    def load(self, tensors: dict[str, Tensor], metas: list[dict[str, Any]]) -> None:
        self.items = []
        for i, m in enumerate(metas):
            p = f"{self.prefix}{i}"
            self.items.append(
                Collected(
                    batch_from_state(tensors, m, p),
                    [Example(a, b, c) for a, b, c in m["examples"]],
                    tensors[f"{p}.rewards"],
                    tensors[f"{p}.components"],
                    tensors[f"{p}.accuracy"],
                    dict(m["metrics"]),
                    **{name: tensors.get(f"{p}.{name}") for name in _OPTIONAL},
                )
            )
