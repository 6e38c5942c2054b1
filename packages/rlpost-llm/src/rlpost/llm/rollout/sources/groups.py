"""Plain groups: ``group_size`` samples of each prompt, scored by the reward functions.

The default generator. :func:`generate` is the trainer's one call into its engine
(whichever engine: lean, HF, vLLM, Ray workers, speculative); :func:`assemble` turns
rounds of scored groups into the step's :class:`~rlpost.llm.rollout.collected.Collected`
(dynamic sampling's refill rounds reuse both).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlpost.core.guard import NonFiniteError, all_finite
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.sources.base import GENERATE, RolloutSource, register_source


def generate(
    trainer: Any, prompts: list[list[int]], n: int, drafts=None, engine: Any = None
) -> RolloutBatch:
    """``n`` samples of each prompt from the trainer's engine, or ``engine`` (DORA's
    per-worker generators; ``drafts``: BubbleSpec's, verified instead of sampled);
    non-finite log-probs mean the weights diverged."""
    eng, sampling = engine or trainer.engine, trainer.sampling
    if drafts is not None:
        batch = eng.generate_with_drafts(prompts, n, sampling, drafts)
    else:
        batch = eng.generate(prompts, n, sampling)
    if not all_finite([batch.logprobs[batch.mask > 0]]):  # engines without a guard
        raise NonFiniteError(
            "the engine's log-probs of the sampled tokens are not finite: the "
            "policy's weights have diverged"
        )
    return batch


class Round(NamedTuple):
    """One generation round: its groups' rollouts, one example per group, the rewards."""

    batch: RolloutBatch
    examples: list[Example]
    rewards: Tensor
    components: Tensor


def engine_metrics(engine: Any) -> dict[str, float]:
    """What the engine reports about itself (worker restarts, compressed-KV cache share,
    speculative acceptance over the run so far)."""
    out = {}
    if hasattr(engine, "restarts"):  # Ray rollout workers replaced so far
        out["rollout/worker_restarts"] = float(engine.restarts)
    st = getattr(engine, "stats", None)
    if st is not None and "cache_columns_max" in st:  # compressed-KV rollouts
        out["kv/cache_fraction"] = st["cache_columns_max"] / max(st["dense_columns_max"], 1)
    elif st is not None:  # speculative decoding
        out["spec/acceptance"] = st["accepted"] / max(st["proposed"], 1)
        out["spec/tokens_per_forward"] = st["tokens"] / max(st["row_rounds"], 1)
    return out


def add_score_metrics(metrics: dict[str, float], new: dict[str, float]) -> None:
    """Merge a scoring round's metrics: timeouts and errors add up, the rest the latest."""
    for k, v in new.items():
        metrics[k] = metrics.get(k, 0.0) + v if k.endswith(("timeouts", "errors")) else v


def assemble(trainer: Any, parts: list[Round], want: int, metrics: dict[str, float]) -> Collected:
    """The step's batch from rounds of whole groups, the first ``want`` groups kept."""
    merged = RolloutBatch.concat([p.batch for p in parts])
    exs = [e for p in parts for e in p.examples]
    rew = torch.cat([p.rewards for p in parts])
    comp = torch.cat([p.components for p in parts])
    if len(exs) > want:  # trim surplus groups
        rows = torch.nonzero(merged.group < want).flatten()
        merged, exs, rew, comp = merged.select(rows), exs[:want], rew[rows], comp[rows]
    metrics.update(engine_metrics(trainer.engine))
    rows_ex = [exs[g] for g in merged.group.tolist()]
    return Collected(merged, rows_ex, rew, comp, trainer.scorer.accuracy(comp), metrics)


@register_source
class GroupsSource(RolloutSource):
    """``rollout.prompts_per_step`` prompts, ``group_size`` samples each, in one round."""

    name = "groups"
    layer = GENERATE
    label = "plain groups"

    def sample(self, examples: list[Example], drafts=None) -> tuple[Round, dict[str, float]]:
        """One round: sample every prompt's group and score it."""
        t = self.trainer
        prompts = [encode_prompt(t.tok, e.prompt) for e in examples]
        batch = generate(t, prompts, t.preset.group_size, drafts)
        res = t.scorer.score(batch, examples)
        return Round(batch, examples, res.rewards, res.components), res.metrics

    def collect(self, want: int | None = None, given=None) -> Collected:
        """``given``: BubbleSpec's ``(examples, drafts)``, the step's prompts and drafts."""
        t = self.trainer
        want = want or t.cfg.rollout.prompts_per_step
        t.prompts.set_step(t.step)
        t0 = time.perf_counter()
        examples = given[0] if given is not None else t.prompts.next_batch(want)
        part, scored = self.sample(examples, given[1] if given is not None else None)
        metrics: dict[str, float] = {}
        add_score_metrics(metrics, scored)
        metrics["dynamic/kept_frac"] = 1.0
        metrics["dynamic/rounds"] = 1.0
        metrics["time/rollout"] = time.perf_counter() - t0
        return assemble(t, [part], want, metrics)
