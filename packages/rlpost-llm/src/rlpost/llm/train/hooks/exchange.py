"""Mutual RL's experience exchange (001-11): each step's rollouts are posted to the run's
exchange and the peers' responses come back into the batch
(:class:`rlpost.llm.runtimes.mutual.Exchanger`, set as :attr:`PeerExchangeHook.channel`
by the runtime that starts the policy)."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Declares, Property
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


@STEP_HOOKS.register
class PeerExchangeHook(StepHook):
    name = "peer_exchange"
    label = "mutual (Mutual RL's peers)"
    example = ("mutual.policies=[{name: a}, {name: b}]", "mutual.member=a")
    declares = Declares(
        requires={
            Property.SAME_THREAD: "exchanges each step's rollouts with the peers (train.pipeline sync)",
            Property.PER_STEP: "exchanges each step's own rollouts (no stages)",
        },
        breaks={Property.ONE_POLICY: "trains several policies"},
    )

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return cfg.mutual is not None

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.channel = None  # ``channel(trainer, collected) -> collected``

    def collected(self, col: Any) -> Any:
        if self.channel is None:
            m = self.trainer.cfg.mutual
            raise ValueError(
                f"mutual.member {m.member!r}: a Mutual RL policy trains beside its peers "
                "through rlpost.llm.runtimes.mutual.run_mutual (rlpost-llm train with the run's config)"
            )
        return self.channel(self.trainer, col)
