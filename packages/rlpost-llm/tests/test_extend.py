"""Extending the trainer without editing it: a rollout source, an input provider and a step
hook registered from this test module train two steps (CONTRIBUTING.md shows the same
three), and each is found by name from config, declares what it needs, and keeps its
state across a resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlpost.core.contract import Declares, Input, Property
from rlpost.llm.config import load_config
from rlpost.llm.rollout.sources import ROLLOUT_SOURCES
from rlpost.llm.rollout.sources.base import SCHEDULE, RolloutSource, register_source
from rlpost.llm.train.hooks import STEP_HOOKS, StepHook
from rlpost.llm.train.providers import INPUT_PROVIDERS, InputProvider, provided_inputs
from rlpost.llm.trainer import Trainer


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


class HalfFresh(RolloutSource):
    """A schedule that generates every other step and trains twice on each batch (a toy:
    the second step's rollouts are one version stale)."""

    name = "half_fresh"
    layer = SCHEDULE
    label = "train.pipeline half_fresh"
    declares = Declares(breaks={Property.PER_STEP: "reuses each batch for two steps"})

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.held = None
        self.generated = 0

    def next(self):
        if self.held is None:
            self.held = self.inner.next()
            self.generated += 1
            return self.held
        col, self.held = self.held, None
        return col

    def max_staleness(self, bound: int) -> int:
        return max(bound, 1)


class NoTrigger(InputProvider):
    """Every response's trigger position: none (-1), for entries that read one."""

    name = "no_trigger"
    provides = frozenset({Input.TRIGGER_POS})

    def provide(self, step: Any) -> None:
        step[Input.TRIGGER_POS] = torch.full((len(step.batch),), -1, dtype=torch.long)


class CountUpdates(StepHook):
    """Counts the updates of the run (kept in checkpoints) and logs the count."""

    name = "count_updates"
    state_key = "count_updates"

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return True

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.updates = 0

    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        self.updates += 1
        metrics["toy/updates"] = float(self.updates)

    def state_dict(self):
        return self.updates, {}

    def load_state_dict(self, state, tensors) -> None:
        self.updates = int(state)


@pytest.fixture
def registered():
    register_source(HalfFresh)
    INPUT_PROVIDERS.register(NoTrigger)
    STEP_HOOKS.register(CountUpdates)
    yield
    del ROLLOUT_SOURCES["half_fresh"]
    INPUT_PROVIDERS.unregister("no_trigger")
    STEP_HOOKS.unregister("count_updates")


def test_a_registered_source_provider_and_hook_train_two_steps(fast_cfg, registered):
    # the provided inputs are derived from the providers: TRIGGER_POS is now among them
    assert Input.TRIGGER_POS in provided_inputs(load_config(None, []))
    cfg = fast_cfg("train.pipeline=half_fresh", "algo.objective.name=mu_grpo", "train.steps=2")
    tr = Trainer(cfg, reward_fn=parity)
    seen = []
    mu = tr.recipe.policy_loss

    def spy(batch):
        seen.append(batch.trigger_pos)
        return mu(batch)

    object.__setattr__(tr.recipe, "policy_loss", spy)
    res = tr.train()
    assert res["steps"] == 2 and res["staleness_histogram"] == {0: 1, 1: 1}
    assert tr.rollouts.generated == 1  # one batch for the two steps
    assert seen and all(t is not None and (t == -1).all() for t in seen)
    rows = [json.loads(x) for x in (Path(cfg.run.dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["toy/updates"] for r in rows if "toy/updates" in r] == [1.0, 2.0]


def test_a_registered_hook_keeps_its_state_across_a_resume(fast_cfg, registered):
    cfg = fast_cfg("train.steps=3", "run.save_every=2")
    first = Trainer(cfg, reward_fn=parity)
    first.train(until=2)
    first.close()
    resumed = Trainer(cfg, reward_fn=parity, resume=True)
    assert resumed.components.get("count_updates").updates == 2
    resumed.train()
    assert resumed.components.get("count_updates").updates == 3


def test_a_registered_source_is_checked_against_the_others(registered):
    from rlpost.llm.config import ConfigError

    with pytest.raises(ConfigError, match=r"train\.pipeline half_fresh reuses each batch"):
        load_config(None, ["train.pipeline=half_fresh", "algo.preset=fbos"])
