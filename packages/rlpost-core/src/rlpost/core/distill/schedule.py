"""How the distillation term and the RL term are weighted over training.

``constant``: fixed weights. ``anneal`` (ATOD, catalog 004-27): OPD dominates early
training and RL is gradually strengthened: both weights move from their start to their end
value over the first ``horizon`` of training (progress in [0, 1]), linearly or on a cosine
(slow at both ends), and stay at the end value after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DistillSchedule:
    kind: Literal["constant", "anneal"] = "constant"
    distill_start: float = 1.0
    distill_end: float = 1.0
    rl_start: float = 1.0
    rl_end: float = 1.0
    shape: Literal["linear", "cosine"] = "cosine"
    horizon: float = 1.0

    def __post_init__(self) -> None:
        for name in ("distill_start", "distill_end", "rl_start", "rl_end"):
            if getattr(self, name) < 0:
                raise ValueError(f"distill schedule: {name} must be >= 0")
        if not 0 < self.horizon <= 1:
            raise ValueError("distill schedule: horizon must be in (0, 1]")
        if self.kind not in ("constant", "anneal") or self.shape not in ("linear", "cosine"):
            raise ValueError("distill schedule: kind constant|anneal, shape linear|cosine")

    @classmethod
    def atod(cls, **changes) -> DistillSchedule:
        """ATOD's annealed OPD -> RL schedule: (distill, rl) from (1, 0) to (0, 1)."""
        base = {"distill_start": 1.0, "distill_end": 0.0, "rl_start": 0.0, "rl_end": 1.0}
        return cls("anneal", **{**base, **changes})

    @property
    def needs_progress(self) -> bool:
        return self.kind == "anneal"

    @property
    def rl_free(self) -> bool:
        """The RL term has weight 0 throughout (pure distillation)."""
        return self.rl_start == 0 and (self.kind == "constant" or self.rl_end == 0)

    def fraction(self, progress: float) -> float:
        """How far the weights have moved from start (0) to end (1) at ``progress``."""
        if self.kind == "constant":
            return 0.0
        x = min(max(progress / self.horizon, 0.0), 1.0)
        return x if self.shape == "linear" else 0.5 * (1.0 - math.cos(math.pi * x))

    def weights(self, progress: float | None) -> tuple[float, float]:
        """``(distill weight, rl weight)`` at ``progress`` (``None``: the start)."""
        if self.kind == "constant":
            return self.distill_start, self.rl_start
        f = self.fraction(progress or 0.0)
        return (
            self.distill_start + f * (self.distill_end - self.distill_start),
            self.rl_start + f * (self.rl_end - self.rl_start),
        )
