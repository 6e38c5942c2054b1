"""Turn signals of multi-turn episodes (``Input.TURNS``): each token's turn, each turn's
signal (``data.env.turn_signal``: the environment's, the information gain, a rubric
judge's score) and, for a rubric, each turn's stage."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Input
from rlpost.llm.train.inputs import Turns
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class TurnsProvider(InputProvider):
    name = "turns"
    order = 65
    provides = frozenset({Input.TURNS})
    hint = "set data.env (multi-turn episodes)"

    @classmethod
    def available(cls, cfg: Any) -> bool:
        return cfg.data.env is not None

    def provide(self, step: Any) -> None:
        col = step.col
        if col.turn_ids is not None:
            step[Input.TURNS] = Turns(col.turn_ids, col.turn_rewards, col.turn_stages)
