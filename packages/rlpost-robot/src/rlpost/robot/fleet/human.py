"""The scripted "human" of a fleet: takes over a robot whose progress stalls.

A fleet operator watches each robot and corrects it when it gets stuck; LWD learns from
those corrections like from any other experience (the executed actions are stored, and
labelled as interventions). :class:`ScriptedHuman` stands in for the operator in
simulation: it watches the task's error measure (``distance``), and when that has not
shrunk by ``min_progress`` over the last ``stall_steps`` steps, the task's good scripted
expert (:func:`rlpost.robot.demos.make_expert`) drives for ``takeover_steps`` steps, then
hands back to the policy (at most ``max_per_episode`` times per episode).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["InterventionConfig", "ScriptedHuman"]


@dataclass(frozen=True)
class InterventionConfig:
    enabled: bool = True
    stall_steps: int = 10
    """Look-back window (control steps) over which progress is judged."""
    min_progress: float = 0.02
    """How much the task's ``distance`` must shrink over the window (metres)."""
    takeover_steps: int = 15
    """Steps the human drives per intervention before handing back."""
    max_per_episode: int = 1

    def __post_init__(self) -> None:
        for name in ("stall_steps", "takeover_steps", "max_per_episode"):
            if getattr(self, name) < 1:
                raise ValueError(f"intervention.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_progress < 0:
            raise ValueError(f"intervention.min_progress must be >= 0, got {self.min_progress}")


class ScriptedHuman:
    """Call :meth:`reset` at the start of an episode, then :meth:`act` each step with the
    observation vector and the task's current ``distance``: an action when the human
    drives this step, else ``None`` (the policy drives)."""

    def __init__(self, task: str, cfg: InterventionConfig, seed: int = 0):
        from rlpost.robot.demos import make_expert

        self.cfg = cfg
        self.expert = make_expert(task, "good", seed)
        self.reset()

    def reset(self) -> None:
        self._dist: list[float] = []
        self._left = 0
        self.count = 0

    @property
    def driving(self) -> bool:
        return self._left > 0

    def act(self, obs: np.ndarray, distance: float | None) -> np.ndarray | None:
        c = self.cfg
        if not c.enabled:
            return None
        if self._left == 0 and distance is not None:
            self._dist.append(float(distance))
            stalled = (
                len(self._dist) > c.stall_steps
                and self._dist[-c.stall_steps - 1] - self._dist[-1] < c.min_progress
            )
            if stalled and self.count < c.max_per_episode:
                self.expert.reset()  # the operator decides afresh (e.g. which goal)
                self._left = c.takeover_steps
                self.count += 1
        if self._left == 0:
            return None
        self._left -= 1
        if self._left == 0:
            self._dist.clear()  # judge the policy afresh after handing back
        return np.asarray(self.expert(obs), dtype=np.float32)
