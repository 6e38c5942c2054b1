"""Training dynamics (``Input.DYNAMICS``): the training progress, the sampled tokens'
mean -log-prob as the entropy estimate, and its first value (kept across a resume)."""

from __future__ import annotations

import math
from typing import Any

from rlpost.core.advantages import TrainingDynamics
from rlpost.core.contract import Input
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class DynamicsProvider(InputProvider):
    name = "dynamics"
    order = 50
    provides = frozenset({Input.DYNAMICS})
    state_key = "initial_entropy"

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.initial_entropy: float | None = None

    def provide(self, step: Any) -> None:
        """(Absent when the engine's log-probs are not finite.)"""
        t, b = self.trainer, step.batch
        entropy = float(-(b.logprobs * b.mask).sum() / b.mask.sum().clamp_min(1.0))
        if self.initial_entropy is None and math.isfinite(entropy):
            self.initial_entropy = entropy
        if math.isfinite(entropy):
            progress = min(1.0, t.step / max(1, t.total_steps - 1))
            step[Input.DYNAMICS] = TrainingDynamics(
                progress, max(entropy, 0.0), self.initial_entropy
            )

    def state_dict(self) -> tuple[Any, dict]:
        return self.initial_entropy, {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.initial_entropy = state
