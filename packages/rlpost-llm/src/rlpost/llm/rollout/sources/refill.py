"""Dynamic sampling (DAPO, 000-01's refill): keep only groups whose rewards differ, and
generate refill rounds until a step has ``rollout.prompts_per_step`` of them (at most
``train.max_refill`` extra rounds)."""

from __future__ import annotations

import time

import torch

from rlpost.core.contract import Declares, Property
from rlpost.core.presets import Choice
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.sources.base import FILTER, RolloutSource, register_source
from rlpost.llm.rollout.sources.groups import Round, add_score_metrics, assemble


def varied(part: Round) -> Round | None:
    """The groups of ``part`` whose rewards are not all equal (None: none)."""
    n = len(part.examples)
    r = part.rewards
    gstd = torch.zeros(n).index_add_(
        0, part.batch.group, (r - r.view(n, -1).mean(1)[part.batch.group]) ** 2
    )
    good = torch.nonzero(gstd > 0).flatten()
    if not len(good):
        return None
    rows = torch.nonzero(torch.isin(part.batch.group, good)).flatten()
    return Round(
        part.batch.select(rows),
        [part.examples[g] for g in good.tolist()],
        r[rows],
        part.components[rows],
    )


@register_source
class RefillSource(RolloutSource):
    """Refill rounds over the inner generator's plain groups."""

    name = "dynamic_sampling"
    layer = FILTER
    label = "dynamic sampling"
    option = "dynamic_sampling"
    example = ("algo.dynamic_sampling=true",)
    declares = Declares(
        requires={Property.SINGLE_TURN: "refills single-turn groups"},
        breaks={Property.ONE_ROUND: "adds refill rounds"},
    )

    @classmethod
    def from_option(cls, value, current):
        return Choice(cls.name) if value else None

    def collect(self, want: int | None = None, given=None) -> Collected:
        t = self.trainer
        want = want or t.cfg.rollout.prompts_per_step
        t.prompts.set_step(t.step)
        t0 = time.perf_counter()
        parts: list[Round] = []
        kept, rounds, seen, metrics = 0, 0, 0, {}
        while True:
            examples = given[0] if given is not None else t.prompts.next_batch(want - kept)
            part, scored = self.inner.sample(examples, given[1] if given is not None else None)
            add_score_metrics(metrics, scored)
            seen += len(examples)
            rounds += 1
            good = varied(part)
            if good is not None:
                parts.append(good)
                kept += len(good.examples)
            if kept >= want or rounds > t.cfg.train.max_refill:
                break
        if not parts:
            empty = torch.zeros(0)
            comps = torch.zeros(0, len(t.scorer.names))
            return Collected(part.batch, [], empty, comps, empty, {"dynamic/kept_frac": 0.0})
        metrics["dynamic/kept_frac"] = kept / max(seen, 1)
        metrics["dynamic/rounds"] = float(rounds)
        metrics["time/rollout"] = time.perf_counter() - t0
        return assemble(t, parts, want, metrics)
