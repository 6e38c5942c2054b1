"""``reward.noise``: the verifier noise's generator kept in the run's checkpoints (the
noise itself is applied where rollouts are scored, :mod:`rlpost.llm.rollout.noise`)."""

from __future__ import annotations

from typing import Any

from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


@STEP_HOOKS.register
class VerifierNoiseHook(StepHook):
    name = "verifier_noise"
    label = "reward.noise"
    state_key = "verifier_noise"
    example = ("reward.noise={false_negative: 0.2}",)

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return cfg.reward.noise is not None

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        if cfg.data.env is not None:
            raise ValueError(
                "reward.noise flips a verifier's binary verdict; data.env episodes are "
                "scored by their environment (no verifier to make noisy)"
            )

    def state_dict(self) -> tuple[Any, dict]:
        return None, self.trainer.scorer.noise.state_dict()

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.trainer.scorer.noise.load_state_dict(tensors)
