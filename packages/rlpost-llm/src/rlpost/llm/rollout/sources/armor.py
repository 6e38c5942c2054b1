"""ARMOR (004-06): anchor rollouts from the reference policy mixed into every group.

Reverse KL keeps the policy near the reference only where the policy samples; it does
not make the policy keep covering what the reference solved. ARMOR samples ``anchors``
extra rollouts of each group's prompt from the frozen reference policy (the initial
weights; a LoRA policy's base with its adapters off), scores them with the run's rewards
and adds them to the group. The group-relative advantage is taken over the mixed group,
and every row is trained by the preset's objective with its own behaviour policy as
``pi_old``: the policy's rows their ``pi_old`` (this step's weights), the anchors the
reference's log-probs of their tokens, so an anchor's ratio is ``pi_theta / pi_ref``
(an off-policy importance weight, clipped by the objective's trust region). That is the
mixed objective: on-policy and anchor terms in one surrogate, no auxiliary loss.

Anchors are marked as trained rows that the policy did not generate (``roles``: peers'
``TRAIN``), so the policy's own accuracy and the behaviour-mismatch metrics leave them
out. Logged per step: ``armor/anchors``, ``armor/anchor_accuracy`` and
``armor/anchor_reward``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.model.policy import Reference
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines import make_local_engine
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.sources.base import FILTER, RolloutSource, register_source, settings_option


@dataclass(frozen=True)
class Armor:
    anchors: int = 2
    """Reference rollouts added to each group."""

    def __post_init__(self) -> None:
        if self.anchors < 1:
            raise ValueError(f"anchors must be >= 1, got {self.anchors}")


def _pad(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@register_source
class ArmorSource(RolloutSource):
    """Each group of the inner source's step, plus anchors from the reference policy."""

    name = "armor"
    layer = FILTER
    params = Armor
    option = "armor"
    example = ("algo.armor={}",)
    label = "ARMOR's anchor rollouts"
    declares = Declares(
        requires={
            Property.SINGLE_TURN: "sample the reference on single-turn prompts",
            Property.ONE_ROUND: "add anchors to one round's groups",
        },
        breaks={Property.EVEN_GROUPS: "add anchor rows to every group"},
    )

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.reference = Reference(self.trainer.model)
        self._engine = None

    from_option = classmethod(settings_option)

    @classmethod
    def rows_per_group(cls, params: Armor, group_size: int) -> int:
        return group_size + params.anchors

    @contextlib.contextmanager
    def _reference(self):
        """The reference model, and an engine sampling it."""
        t = self.trainer
        with self.reference.active(t.model) as ref:
            if self._engine is None or self._engine.model is not ref:
                self._engine = make_local_engine("auto", ref, t.tok)
            yield ref, self._engine

    def collect(self, want: int | None = None, given: Any = None) -> Collected:
        t, k = self.trainer, self.params.anchors
        col = self.inner.collect(want, given)
        if not len(col.batch):
            return col
        g = col.batch.group
        first = [int(torch.nonzero(g == j)[0]) for j in range(col.n_groups())]
        prompts = [col.batch.prompt_ids[i] for i in first]
        examples = [col.examples[i] for i in first]
        old = (
            col.old_logp if col.old_logp is not None else t.forwards.nograd(t.model, col.batch).logp
        )
        with self._reference() as (ref, engine):
            anchors = engine.generate(prompts, k, t.sampling)
            ref_logp = t.forwards.nograd(ref, anchors).logp
        anchors = dataclasses.replace(anchors, policy_version=col.batch.policy_version)
        res = t.scorer.score(anchors, examples)
        acc = t.scorer.accuracy(res.components)
        both = RolloutBatch.concat([col.batch, anchors])
        groups = torch.cat([g, anchors.group])
        order = torch.argsort(groups, stable=True)  # each prompt's rows together, anchors last
        width = both.completion_ids.shape[1]
        own = col.roles if col.roles is not None else torch.full((len(g),), OWN)
        metrics = {**col.metrics, "armor/anchors": float(len(anchors)),
                   "armor/anchor_accuracy": float(acc.float().mean()),
                   "armor/anchor_reward": float(res.rewards.mean())}  # fmt: skip
        return Collected(
            dataclasses.replace(both, group=groups).select(order),
            [(col.examples + [e for e in examples for _ in range(k)])[i] for i in order.tolist()],
            torch.cat([col.rewards, res.rewards])[order],
            torch.cat([col.components, res.components])[order],
            torch.cat([col.accuracy, acc.to(col.accuracy.dtype)])[order],
            metrics,
            old_logp=torch.cat([_pad(old, width), _pad(ref_logp, width)])[order],
            roles=torch.cat([own, torch.full((len(anchors),), TRAIN)])[order],
        )
