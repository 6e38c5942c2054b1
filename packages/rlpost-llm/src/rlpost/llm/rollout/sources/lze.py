"""LZE (000-18): the learning-zone energy of every training prompt, kept across steps.

LZE needs a finite training set whose prompts it can score and revisit: a data file's
training rows, or, for a synthetic task, ``pool`` prompts drawn from it once (seeded by
``run.seed``). At its first step the initial policy's probability of every prompt's
reference answer is computed in one no-grad forward: each prompt's difficulty anchor
(:func:`rlpost.core.selection.anchor_pass_rate`; 0.5 for a prompt without an answer).

A step takes the next ``rollout.prompts_per_step`` prompts of the epoch's order (the
unpruned prompts and the epoch's replays, shuffled), samples and scores a group of
each, updates each prompt's pass-rate estimate and computes its energy
(:mod:`rlpost.core.selection`), and trains on the ``keep`` share of the groups with the
highest energy (the *backward selector*). A prompt solved in every sample of
``patience`` consecutive visits is pruned: no rollout is generated for it again,
except that each epoch a ``replay`` share of the pruned prompts (at least one when all
are) is put back in the order; one that is no longer solved is restored.

``keep: 1`` with ``patience: 0`` is plain GRPO over the same finite pool: the benchmark's
full-data baseline. The pool's state (estimates, streaks, pruned set, epoch order) is
checkpointed and a resumed run continues exactly.

Logged per step: ``lze/kept``, ``lze/energy_kept`` and ``lze/energy_dropped`` (mean),
``lze/collapsed_frac`` (the step's groups whose samples were all right or all wrong),
``lze/pruned_frac`` (of the pool), ``lze/replayed`` and ``lze/restored`` (this step's),
``lze/epoch``, and ``rollouts/generated``.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.selection import anchor_pass_rate, ema, energy, pruner_step, select_top
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example
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
class LZE:
    keep: float = 0.4
    """Share of each step's groups the update trains on (the highest energy)."""
    alpha: float = 1.0
    """Weight of the pass-rate momentum."""
    beta: float = 0.5
    """Decay of the pass-rate moving average."""
    tau: float = 0.1
    """Gumbel noise on the log-energies before ranking (0: greedy)."""
    patience: int = 2
    """Consecutive fully solved visits before a prompt is pruned (0: never prune)."""
    replay: float = 0.25
    """Share of the pruned prompts put back into each epoch to check for forgetting."""
    pool: int = 512
    """Prompts drawn once from a synthetic task as the training set (a data file: its rows)."""

    def __post_init__(self) -> None:
        checks = [
            (0 < self.keep <= 1, f"keep must be in (0, 1], got {self.keep}"),
            (self.alpha >= 0, f"alpha must be >= 0, got {self.alpha}"),
            (0 <= self.beta < 1, f"beta must be in [0, 1), got {self.beta}"),
            (self.tau >= 0, f"tau must be >= 0, got {self.tau}"),
            (self.patience >= 0, f"patience must be >= 0, got {self.patience}"),
            (0 <= self.replay <= 1, f"replay must be in [0, 1], got {self.replay}"),
            (self.pool >= 2, f"pool must be >= 2 prompts, got {self.pool}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


class Pool:
    """The training prompts and their LZE state (see the module docstring)."""

    def __init__(self, examples: list[Example], params: LZE, seed: int):
        self.examples, self.params, self.seed = examples, params, seed
        n = len(examples)
        self.anchor = torch.full((n,), float("nan"))
        self.p = torch.zeros(n)
        self.streak = torch.zeros(n, dtype=torch.long)
        self.pruned = torch.zeros(n, dtype=torch.bool)
        self.visits = torch.zeros(n, dtype=torch.long)
        self.epoch, self.pos, self.order, self.replayed = -1, 0, [], 0

    def set_anchor(self, anchor: Tensor) -> None:
        self.anchor, self.p = anchor.clone(), anchor.clone()

    def _new_epoch(self) -> None:
        self.epoch += 1
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        pruned = torch.nonzero(self.pruned).flatten().tolist()
        active = torch.nonzero(~self.pruned).flatten().tolist()
        n_replay = round(self.params.replay * len(pruned)) if pruned else 0
        if not active:
            n_replay = max(n_replay, 1)
        replays = rng.sample(pruned, n_replay)
        self.order, self.pos, self.replayed = active + replays, 0, len(replays)
        rng.shuffle(self.order)

    def next_indices(self, n: int) -> tuple[list[int], int]:
        """The next ``n`` prompts' indices, and how many of them are replays."""
        out, replays = [], 0
        while len(out) < n:
            if self.pos >= len(self.order):
                self._new_epoch()
            i = self.order[self.pos]
            replays += int(bool(self.pruned[i]))
            out.append(i)
            self.pos += 1
        return out, replays

    def observe(self, idx: Tensor, pass_rate: Tensor, solved: Tensor) -> tuple[Tensor, Tensor]:
        """Update the visited prompts; their energies, and which were restored."""
        pr = self.params
        before = self.p[idx]
        after = ema(before, pass_rate, pr.beta)
        self.p[idx], self.visits[idx] = after, self.visits[idx] + 1
        restored = torch.zeros(len(idx), dtype=torch.bool)
        if pr.patience > 0:
            streak, pruned, restored = pruner_step(
                self.streak[idx], self.pruned[idx], solved, pr.patience
            )
            self.streak[idx], self.pruned[idx] = streak, pruned
        return energy(after, before, pr.alpha), restored

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> tuple[dict, dict[str, Tensor]]:
        meta = {"epoch": self.epoch, "pos": self.pos, "order": self.order,
                "replayed": self.replayed}  # fmt: skip
        tensors = {"lze.anchor": self.anchor, "lze.p": self.p, "lze.streak": self.streak,
                   "lze.pruned": self.pruned, "lze.visits": self.visits}  # fmt: skip
        return meta, tensors

    def load(self, meta: dict, tensors: dict[str, Tensor]) -> None:
        self.epoch, self.pos, self.order = meta["epoch"], meta["pos"], list(meta["order"])
        self.replayed = meta["replayed"]
        for key in ("anchor", "p", "streak", "pruned", "visits"):
            setattr(self, key, tensors[f"lze.{key}"].clone())


def training_set(prompts: Any, params: LZE, seed: int) -> list[Example]:
    """The finite training set LZE scores: a data file's rows, or ``params.pool`` prompts
    drawn once from the synthetic task."""
    if getattr(prompts, "examples", None) is not None:
        return list(prompts.examples)
    task = getattr(prompts, "task", None)
    if task is None:
        raise ValueError("algo.lze: needs one task or a data file (not a mixture or curriculum)")
    return task.sample(params.pool, random.Random(seed * 7919 + 17))


def answer_logprobs(trainer: Any, examples: list[Example]) -> Tensor:
    """The summed log-probability of each example's reference answer (then EOS) under the
    trainer's current policy, teacher-forced in one no-grad pass (NaN: no answer)."""
    t = trainer
    eos = t.tok.eos_token_id
    rows = []
    for e in examples:
        ids = t.tok(e.answer, add_special_tokens=False).input_ids if e.answer else []
        rows.append((encode_prompt(t.tok, e.prompt), [*ids, eos], [0.0] * (len(ids) + 1), "stop"))
    batch = RolloutBatch.from_rows(rows, len(rows), 1, t.tok.pad_token_id or 0)
    model = t.engine.model if t.learner.sharded else t.model
    logp = t.forwards.nograd(model, batch).logp.sum(1)
    return torch.where(torch.tensor([bool(e.answer) for e in examples]), logp, float("nan"))


@register_source
class LZESource(RolloutSource):
    """A finite pool scored by learning-zone energy; the update gets its top share."""

    name = "lze"
    layer = GENERATE
    params = LZE
    option = "lze"
    example = ("algo.lze={}",)
    label = "LZE's data selection"
    state_key = "lze"
    declares = Declares(
        requires={
            Property.SINGLE_TURN: "score single-turn prompts against their answers",
            Property.ONE_ROUND: "select among one step's own groups",
        },
        breaks={Property.GROUPS_ON_DEMAND: "generate whole steps from its pool's order"},
    )

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        t = self.trainer
        self.pool = Pool(training_set(t.prompts, params, t.cfg.run.seed), params, t.cfg.run.seed)

    from_option = classmethod(settings_option)

    @classmethod
    def check(cls, cfg: Any, preset: Any, params: LZE) -> None:
        if cfg.data.mixture or cfg.data.curriculum:
            raise ValueError(
                "algo.lze: needs one task or a data file (not a mixture or curriculum)"
            )

    def collect(self, want: int | None = None, given: Any = None) -> Collected:
        t, pool = self.trainer, self.pool
        if torch.isnan(pool.anchor).all():
            logp = answer_logprobs(t, pool.examples)
            pool.set_anchor(torch.where(logp.isnan(), 0.5, anchor_pass_rate(logp)))
        n, group = want or t.cfg.rollout.prompts_per_step, t.preset.group_size
        t0 = time.perf_counter()
        idx, replays = pool.next_indices(n)
        examples = [pool.examples[i] for i in idx]
        batch = generate(t, [encode_prompt(t.tok, e.prompt) for e in examples], group)
        res = t.scorer.score(batch, examples)
        metrics: dict[str, float] = {}
        add_score_metrics(metrics, res.metrics)
        acc = t.scorer.accuracy(res.components).float().view(n, group)
        e, restored = pool.observe(torch.tensor(idx), acc.mean(1), acc.min(1).values > 0)
        gen = torch.Generator().manual_seed(t.cfg.run.seed * 1_000_003 + t.step)
        kept = select_top(e, max(1, math.ceil(self.params.keep * n - 1e-9)), self.params.tau, gen)
        dropped = torch.ones(n, dtype=torch.bool)
        dropped[kept] = False
        metrics.update({
            "lze/kept": float(len(kept)),
            "lze/energy_kept": float(e[kept].mean()),
            "lze/energy_dropped": float(e[dropped].mean()) if dropped.any() else 0.0,
            "lze/collapsed_frac": float((acc.min(1).values == acc.max(1).values).float().mean()),
            "lze/pruned_frac": float(pool.pruned.float().mean()),
            "lze/replayed": float(replays),
            "lze/restored": float(restored.sum()),
            "lze/epoch": float(pool.epoch),
            "rollouts/generated": float(n * group),
            "time/rollout": time.perf_counter() - t0,
        })  # fmt: skip
        rows = (kept[:, None] * group + torch.arange(group)).flatten()
        part = Round(batch.select(rows), [examples[i] for i in kept.tolist()],
                     res.rewards[rows], res.components[rows])  # fmt: skip
        return assemble(t, [part], len(kept), metrics)

    def state_dict(self) -> tuple[Any, dict]:
        return self.pool.state()

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.pool.load(state, tensors)
