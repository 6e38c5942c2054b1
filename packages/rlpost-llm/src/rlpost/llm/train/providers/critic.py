"""Critic values (``Input.VALUES``: GAE for PPO, SAO): a value model trained beside the
policy (:class:`~rlpost.llm.train.critic.ValueModel`, the ``critic`` section). It gives
each step's values before the advantages, takes the estimator's returns as its targets,
trains on every micro-batch with its own optimiser, and, for ``critic.warmup_steps``,
trains alone while the policy waits."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Declares, Input, Property
from rlpost.llm.train.critic import ValueModel, explained_variance
from rlpost.llm.train.inputs import Role
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class CriticProvider(InputProvider):
    name = "critic"
    label = "a critic (critic values)"
    order = 40
    example = ("algo.advantage.name=gae",)
    provides = frozenset({Input.VALUES})
    declares = Declares(
        requires={
            Property.UNSHARDED: "copies the policy's whole decoder",
            Property.WHOLE_BATCH: "normalises its loss by the whole step batch",
        }
    )

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        cfg = trainer.cfg
        self.critic = ValueModel(cfg.critic, trainer.model, cfg.model.dtype)

    def provide(self, step: Any) -> None:
        t = self.trainer
        parts = [sb for _, sb in t.forwards.seq_batches(step.batch, pack=False)]
        step[Input.VALUES] = self.critic.values(parts) * step.batch.mask

    def advantaged(self, step: Any, out: Any) -> None:
        if out.returns is None:
            raise ValueError(
                f"{self.trainer.recipe.advantage} returns no value targets for the critic"
            )
        step[Role.RETURNS] = out.returns

    def trains_policy(self) -> bool:
        return self.trainer.step >= self.trainer.cfg.critic.warmup_steps

    def micro_batch(self, mb: Any, acc: Any) -> None:
        """The clipped value loss of the micro-batch, back-propagated into the critic."""
        step, idx, sub = mb.step, mb.idx, mb.sub
        vsb = self.trainer.forwards.seq_batch(sub, dense=True)
        self.critic.learner.sync(last=mb.last)
        vloss, vm = self.critic.loss(
            vsb, step[Input.VALUES][idx], step[Role.RETURNS][idx], step.mask[idx], step.counts()[0]
        )
        (vloss * (mb.weight * self.critic.learner.scale)).backward()
        if mb.weight:
            acc.add(vm)

    def end_epoch(self, acc: Any) -> None:
        acc.add({"value/grad_norm": self.critic.step()})

    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        metrics["value/explained_variance"] = explained_variance(
            step[Input.VALUES], step[Role.RETURNS], step.batch.mask
        )

    def checkpoint_extras(self) -> dict[str, tuple[Any, Any]]:
        return {"critic": (self.critic.module, self.critic.optimizer)}
