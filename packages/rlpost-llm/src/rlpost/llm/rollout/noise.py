"""Controlled verifier noise (catalog 000-07, "verifier noise affects the rate of learning
but not its final outcome?"): the verifier's binary verdict flipped at requested rates.

For each scored completion with true verdict ``c`` (the ``correct`` component, else the
first, at 1), an independent uniform draw ``u`` decides what the training reward sees::

    observed = 1  if c = 0 and u < false_positive     (a wrong answer passes)
    observed = 0  if c = 1 and u < false_negative     (a right answer fails)
    observed = c  otherwise

and the scalar reward moves by ``weight * (observed - component)``. The components, the
accuracy and every evaluation keep the true verdict, so a run's curves show what the
policy really does while it learns from the noisy signal. The flips come from the noise's
own seeded generator, checkpointed with the run (:class:`VerifierNoise` ``state_dict``),
and each round logs the injected rates: ``noise/false_positive`` (flipped among the
wrong) and ``noise/false_negative`` (flipped among the right), and ``reward/clean_mean``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor


class VerifierNoise:
    """Flips of one binary reward column (see the module docstring)."""

    def __init__(self, cfg: Any, column: int, weight: float):
        self.false_positive, self.false_negative = cfg.false_positive, cfg.false_negative
        self.column, self.weight = column, float(weight)
        self.generator = torch.Generator().manual_seed(int(cfg.seed))

    def apply(self, result: Any) -> Any:
        """``result`` (a :class:`~rlpost.core.pool.RewardResult`) with the noisy scalar
        reward and the injected rates in its metrics; components unchanged."""
        comp = result.components[:, self.column]
        right = comp >= 1.0
        u = torch.rand(len(comp), generator=self.generator)
        up = ~right & (u < self.false_positive)
        down = right & (u < self.false_negative)
        observed = torch.where(up, 1.0, torch.where(down, 0.0, right.float()))
        rewards = result.rewards + self.weight * (observed - comp.float()) * (up | down)
        metrics = dict(result.metrics)
        metrics["reward/clean_mean"] = float(result.rewards.mean()) if len(comp) else 0.0
        metrics["reward/mean"] = float(rewards.mean()) if len(comp) else 0.0
        metrics["reward/std"] = float(rewards.std()) if len(comp) > 1 else 0.0
        metrics["noise/false_positive"] = _rate(up, ~right)
        metrics["noise/false_negative"] = _rate(down, right)
        return replace(result, rewards=rewards, metrics=metrics)

    def state_dict(self) -> dict[str, Tensor]:
        return {"verifier_noise.generator": self.generator.get_state()}

    def load_state_dict(self, tensors: dict[str, Tensor]) -> None:
        self.generator.set_state(tensors["verifier_noise.generator"])


def _rate(flipped: Tensor, among: Tensor) -> float:
    n = int(among.sum())
    return float(flipped.sum()) / n if n else 0.0
