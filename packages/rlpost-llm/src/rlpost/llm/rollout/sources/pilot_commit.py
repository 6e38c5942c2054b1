"""Pilot-Commit (000-05): a step's rollout budget spent where rewards vary.

A step has a budget of ``B`` rollouts (``budget``, default ``rollout.prompts_per_step x
group_size``). The *pilot* spends ``fraction x B`` of it on ``samples`` rollouts of each of
``M = fraction B / samples`` candidate prompts and estimates each prompt's reward
variance from them. The *commit* spends the rest on the highest-variance candidates:
each committed prompt gets ``group_size - samples`` more rollouts, and its group is its
pilot rollouts plus those, so ``(B - M samples) / (group_size - samples)`` prompts are
committed, in order of pilot variance. A candidate whose pilot rewards are all equal
(collapsed: solved or hopeless) is never committed, however much budget is left; the
rest of the budget is then not spent. Only committed groups are trained on.

Logged per step: ``pilot/candidates``, ``pilot/committed``, ``pilot/collapsed_frac``,
``pilot/var_committed`` and ``pilot/var_skipped`` (the mean pilot variance of each side),
and ``rollouts/generated`` (pilot + commit, the budget actually spent).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.sources.base import (
    GENERATE,
    RolloutSource,
    register_source,
    settings_option,
)
from rlpost.llm.rollout.sources.groups import Round, add_score_metrics, assemble, generate


@dataclass(frozen=True)
class PilotCommit:
    fraction: float = 0.5
    """Share of the step's budget the pilot spends."""
    samples: int = 2
    """Pilot rollouts per candidate prompt (>= 2: a variance needs two)."""
    budget: int | None = None
    """Rollouts per step (None: rollout.prompts_per_step x group_size)."""

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise ValueError(f"fraction must be in (0, 1), got {self.fraction}")
        if self.samples < 2:
            raise ValueError(f"samples must be >= 2 (a variance needs two), got {self.samples}")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"budget must be >= 1 rollouts, got {self.budget}")

    def plan(self, budget: int, group_size: int) -> tuple[int, int]:
        """``(candidates, commits)`` for a step of ``budget`` rollouts."""
        if group_size <= self.samples:
            raise ValueError(
                f"group_size ({group_size}) must exceed the pilot's samples ({self.samples}): "
                "a committed prompt gets group_size - samples more rollouts"
            )
        candidates = max(1, round(self.fraction * budget) // self.samples)
        left = budget - candidates * self.samples
        return candidates, max(0, left // (group_size - self.samples))


def allocate(pilot_rewards: Tensor, commits: int) -> Tensor:
    """The candidates to commit: at most ``commits`` of them, highest pilot variance
    first, never one whose pilot rewards are all equal. ``pilot_rewards``: ``[M, k]``."""
    var = pilot_rewards.float().var(1, unbiased=False)
    order = torch.argsort(var, descending=True, stable=True)
    return order[var[order] > 0][:commits]


@register_source
class PilotCommitSource(RolloutSource):
    """A pilot round over many candidates, then the budget committed to the varied."""

    name = "pilot_commit"
    layer = GENERATE
    params = PilotCommit
    option = "pilot_commit"
    example = ("algo.pilot_commit={}",)
    label = "Pilot-Commit's allocation"
    declares = Declares(
        requires={
            Property.SINGLE_TURN: "allocate single-turn prompts' rollouts",
            Property.ONE_ROUND: "split one step's budget between its own pilot and commit",
        },
        breaks={Property.GROUPS_ON_DEMAND: "generate a fixed pilot-and-commit step"},
    )

    from_option = classmethod(settings_option)

    @classmethod
    def check_preset(cls, preset: Any, params: PilotCommit) -> None:
        try:
            params.plan(params.budget or preset.group_size, preset.group_size)
        except ValueError as exc:
            raise ValueError(f"algo.pilot_commit: {exc}") from None

    def collect(self, want: int | None = None, given: Any = None) -> Collected:
        t, p = self.trainer, self.params
        group = t.preset.group_size
        budget = p.budget or (want or t.cfg.rollout.prompts_per_step) * group
        n_cand, n_commit = p.plan(budget, group)
        t.prompts.set_step(t.step)
        t0 = time.perf_counter()
        examples = t.prompts.next_batch(n_cand)
        pilot = generate(t, [encode_prompt(t.tok, e.prompt) for e in examples], p.samples)
        res = t.scorer.score(pilot, examples)
        metrics: dict[str, float] = {}
        add_score_metrics(metrics, res.metrics)
        pr = res.rewards.view(n_cand, p.samples)
        chosen = allocate(pr, n_commit)
        var = pr.var(1, unbiased=False)
        metrics.update(self._metrics(var, chosen, n_cand))
        parts = []
        if len(chosen):
            parts.append(self._commit(pilot, res, examples, chosen.tolist(), group, metrics))
        generated = n_cand * p.samples + len(chosen) * (group - p.samples)
        metrics["rollouts/generated"] = float(generated)
        metrics["time/rollout"] = time.perf_counter() - t0
        if not parts:
            empty = torch.zeros(0)
            comps = torch.zeros(0, len(t.scorer.names))
            return Collected(pilot.select([]), [], empty, comps, empty, metrics)
        return assemble(t, parts, len(chosen), metrics)

    @staticmethod
    def _metrics(var: Tensor, chosen: Tensor, n_cand: int) -> dict[str, float]:
        picked = torch.zeros(n_cand, dtype=torch.bool)
        picked[chosen] = True
        return {
            "pilot/candidates": float(n_cand),
            "pilot/committed": float(len(chosen)),
            "pilot/collapsed_frac": float((var == 0).float().mean()),
            "pilot/var_committed": float(var[picked].mean()) if picked.any() else 0.0,
            "pilot/var_skipped": float(var[~picked].mean()) if (~picked).any() else 0.0,
        }

    def _commit(self, pilot, res, examples, chosen: list[int], group: int, metrics) -> Round:
        """The committed prompts' groups: their pilot rollouts and ``group - samples``
        more each, in one batch, a group per prompt."""
        t, k = self.trainer, self.params.samples
        exs = [examples[i] for i in chosen]
        more = generate(t, [encode_prompt(t.tok, e.prompt) for e in exs], group - k)
        res2 = t.scorer.score(more, exs)
        add_score_metrics(metrics, res2.metrics)
        rows = torch.tensor([i * k + j for i in chosen for j in range(k)])
        first = pilot.select(rows)  # groups renumbered 0..len(chosen)-1, in chosen order
        both = RolloutBatch.concat([first, more])  # (concat keeps the two rounds' groups apart)
        groups = torch.cat([first.group, more.group])  # both 0..len(chosen)-1, chosen order
        both = dataclasses.replace(both, group=groups)
        order = torch.argsort(groups, stable=True)  # each prompt's rows together
        rewards = torch.cat([res.rewards[rows], res2.rewards])[order]
        comps = torch.cat([res.components[rows], res2.components])[order]
        return Round(both.select(order), exs, rewards, comps)
