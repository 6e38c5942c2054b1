"""ASTOR (001-18): a multi-task step's budget routed by task utility, then to informative
prompts; each task's KL coefficient scaled by its state.

The tasks are ``data.mixture``'s domains. Each task keeps its learning potential (the
moving average of its groups' ``4 p (1 - p)``) and its cross-task synergy (the mean cosine
of its policy gradient with the other tasks', measured every ``synergy_every`` steps on
the step's own rollouts: group-normalised rewards as advantages, one forward and backward
per task on the trainer's model); their utility ``LP (1 + lam S)``
(:mod:`rlpost.core.multitask`) decides the step:

1. **over tasks**: the ``rollout.prompts_per_step`` prompts are split in proportion to
   ``floor + (1 - K floor) softmax(U / tau)``;
2. **within a task**: ``oversample`` times its share of candidates are drawn and the most
   informative kept, by the policy's prior pass rate on each (its probability of the
   reference answer, one no-grad forward: :func:`rlpost.llm.rollout.sources.lze.
   answer_logprobs`), ranked by ``4 p (1 - p)``;
3. **per-task KL**: each row's KL term is scaled by its task's
   :func:`~rlpost.core.multitask.kl_scales` (the ``astor_kl`` step hook puts the scales
   on the step).

Logged per step and task: ``astor/share/<task>``, ``astor/potential/<task>``,
``astor/synergy/<task>``, ``astor/utility/<task>``, ``astor/kl_scale/<task>``. The
potentials and synergies are checkpointed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.multitask import allocate, kl_scales, learning_potential, synergy, utility
from rlpost.core.selection import anchor_pass_rate
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example
from rlpost.llm.model.policy import make_seq_batch
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.sources.base import (
    GENERATE,
    RolloutSource,
    register_source,
    settings_option,
)
from rlpost.llm.rollout.sources.groups import Round, add_score_metrics, assemble, generate
from rlpost.llm.rollout.sources.lze import answer_logprobs
from rlpost.llm.train.forward import host_logprobs

_GRADS = "measures each task's gradient on the trainer's model between updates"


@dataclass(frozen=True)
class Astor:
    tau: float = 0.1
    """Temperature of the softmax over task utilities."""
    floor: float = 0.1
    """Least share of the budget every task gets (it keeps being measured)."""
    lam: float = 1.0
    """Weight of the cross-task synergy in the utility."""
    beta: float = 0.7
    """Decay of the learning potential's moving average."""
    synergy_every: int = 5
    """Steps between synergy measurements (0: never; synergy stays 0)."""
    oversample: float = 2.0
    """Candidates drawn per allotted prompt for the within-task priority (1: none)."""
    adaptive_kl: bool = True
    """Scale each task's KL coefficient by its state (needs a KL term in the loss)."""
    kl_min: float = 0.25
    kl_max: float = 4.0

    def __post_init__(self) -> None:
        checks = [
            (self.tau > 0, f"tau must be > 0, got {self.tau}"),
            (self.floor >= 0, f"floor must be >= 0, got {self.floor}"),
            (0 <= self.beta < 1, f"beta must be in [0, 1), got {self.beta}"),
            (self.synergy_every >= 0, f"synergy_every must be >= 0, got {self.synergy_every}"),
            (self.oversample >= 1, f"oversample must be >= 1, got {self.oversample}"),
            (0 < self.kl_min <= 1 <= self.kl_max, "kl_min <= 1 <= kl_max, kl_min > 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


def informative(trainer: Any, candidates: list[Example], k: int) -> list[Example]:
    """The ``k`` candidates whose prior pass rate (the policy's probability of the reference
    answer) is nearest 1/2, in the order drawn."""
    if k >= len(candidates):
        return candidates
    p = anchor_pass_rate(answer_logprobs(trainer, candidates).nan_to_num(math.log(0.5)))
    keep = torch.argsort(-(4 * p * (1 - p)), stable=True)[:k].sort().values
    return [candidates[i] for i in keep.tolist()]


def task_gradients(trainer: Any, batch: Any, rewards: Tensor, task: Tensor, k: int) -> Tensor:
    """``[k, D]``: each task's policy gradient on the trainer's model, the group-normalised
    rewards as advantages (a task without rows: zeros)."""
    t = trainer
    params = [p for p in t.model.parameters() if p.requires_grad]
    g = batch.group
    size = torch.bincount(g).clamp_min(1)
    mean = torch.zeros(len(size)).index_add_(0, g, rewards) / size
    std = (torch.zeros(len(size)).index_add_(0, g, (rewards - mean[g]) ** 2) / size).sqrt()
    adv = (rewards - mean[g]) / (std[g] + 1e-6)
    out = torch.zeros(k, sum(p.numel() for p in params))
    for j in range(k):
        rows = torch.nonzero(task == j).flatten()
        if not len(rows) or not adv[rows].abs().sum():
            continue
        sub = batch.select(rows)
        sb = make_seq_batch(sub.prompt_ids, sub.completion_ids, sub.mask, sub.pad_id)
        logp = host_logprobs(t.model, sb, t.sampling.temperature, impl="logits")[0]
        m = sub.mask
        loss = -(adv[rows][:, None] * logp * m).sum() / m.sum().clamp_min(1.0)
        grads = torch.autograd.grad(loss.to(params[0].device), params, allow_unused=True)
        out[j] = torch.cat([(x if x is not None else torch.zeros_like(p)).flatten().cpu()
                            for x, p in zip(grads, params, strict=True)])  # fmt: skip
    return out


@register_source
class AstorSource(RolloutSource):
    """A mixture's step split over tasks by utility, then over informative prompts."""

    name = "astor"
    layer = GENERATE
    params = Astor
    option = "astor"
    example = (
        "algo.astor={adaptive_kl: false}",
        "data.mixture=[{task: arithmetic}, {task: countdown}]",
    )
    label = "ASTOR's multi-task schedule"
    state_key = "astor"
    declares = Declares(
        requires={
            Property.ONE_ROUND: "routes one round's budget",
            Property.SAME_THREAD: _GRADS,
            Property.UNSHARDED: _GRADS,
        },
        breaks={Property.GROUPS_ON_DEMAND: "generate whole routed steps"},
    )

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.names = list(self.trainer.prompts.names)
        k = len(self.names)
        self.potential = torch.ones(k)  # (unmeasured: the most a task can have)
        self.synergy = torch.zeros(k)

    from_option = classmethod(settings_option)

    @classmethod
    def check(cls, cfg: Any, preset: Any, params: Astor) -> None:
        if len(cfg.data.mixture) < 2:
            raise ValueError("algo.astor: needs data.mixture with at least two tasks")
        if params.adaptive_kl and (preset.kl_coef <= 0 or preset.kl_in_reward):
            raise ValueError(
                "algo.astor: adaptive_kl scales a KL term in the loss; set algo.kl_coef > 0 "
                "or algo.astor={adaptive_kl: false}"
            )

    def utility(self) -> Tensor:
        return utility(self.potential, self.synergy, self.params.lam)

    def kl_scales(self) -> Tensor:
        p = self.params
        return kl_scales(self.utility(), p.kl_min, p.kl_max)

    def row_scales(self, examples: list[Example]) -> Tensor:
        """``[N]``: each row's KL multiplier, its task's."""
        scales = self.kl_scales()
        return scales[[self.names.index(e.meta["domain"]) for e in examples]]

    def _draw(self, counts: list[int]) -> list[Example]:
        mix, out = self.trainer.prompts, []
        for name, c in zip(self.names, counts, strict=True):
            if c:
                drawn = mix.draw(name, math.ceil(c * self.params.oversample))
                out += informative(self.trainer, drawn, c)
        return out

    def collect(self, want: int | None = None, given: Any = None) -> Collected:
        t, p = self.trainer, self.params
        n, group = want or t.cfg.rollout.prompts_per_step, t.preset.group_size
        t0 = time.perf_counter()
        util = self.utility()
        counts = allocate(util, n, p.tau, p.floor)
        examples = self._draw(counts)
        batch = generate(t, [encode_prompt(t.tok, e.prompt) for e in examples], group)
        res = t.scorer.score(batch, examples)
        metrics: dict[str, float] = {}
        add_score_metrics(metrics, res.metrics)
        task = torch.tensor([self.names.index(e.meta["domain"]) for e in examples])
        rates = t.scorer.accuracy(res.components).float().view(n, group).mean(1)
        scales = self.kl_scales()
        for j, name in enumerate(self.names):
            metrics[f"astor/share/{name}"] = counts[j] / n
            metrics[f"astor/utility/{name}"] = float(util[j])
            metrics[f"astor/kl_scale/{name}"] = float(scales[j])
            if counts[j]:
                lp = learning_potential(rates[task == j])
                self.potential[j] = p.beta * self.potential[j] + (1 - p.beta) * lp
            metrics[f"astor/potential/{name}"] = float(self.potential[j])
        if p.synergy_every and t.step % p.synergy_every == 0:
            grads = task_gradients(
                t, batch, res.rewards, task.repeat_interleave(group), len(counts)
            )
            self.synergy = synergy(grads)
        metrics.update({f"astor/synergy/{nm}": float(s) for nm, s in zip(self.names, self.synergy,
                                                                          strict=True)})  # fmt: skip
        metrics["time/rollout"] = time.perf_counter() - t0
        return assemble(t, [Round(batch, examples, res.rewards, res.components)], n, metrics)

    def state_dict(self) -> tuple[Any, dict]:
        return {}, {"astor.potential": self.potential, "astor.synergy": self.synergy}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.potential = tensors["astor.potential"].clone()
        self.synergy = tensors["astor.synergy"].clone()
