"""RAC (000-19): the ranking-aware and the clean/corrupted confidence losses added to the
policy loss (``algo.rac``), on the policy's own confidence, the mean token log-probability
of a response (:mod:`rlpost.core.confidence`).

Per micro-batch of whole groups: ``rank x ranking_loss / groups`` (a better response of a
group must be more confident than a worse one) and ``pair x corruption_loss / responses``
(the policy must be less confident given its prompt with digits masked,
:mod:`rlpost.llm.data.corruption`), normalised by the step's groups and responses so that
micro-batches add up to the full batch. The corrupted side is, by default
(``pair_sample: true``), the policy's own answer to the corrupted prompt: one sample per
row, drawn before the update, scored in one more differentiable forward, so what falls is
the confidence of what the policy says on degraded input. ``pair_sample: false`` re-scores
the row's own response under the corrupted prompt instead (no sampling). Logged: ``rac/rank_loss``, ``rac/pair_loss`` and ``rac/confidence_drop`` (the mean
of clean minus corrupted confidence)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rlpost.core.confidence import corruption_loss, ranking_loss, sequence_confidence
from rlpost.core.contract import Declares, Property
from rlpost.llm.data.corruption import corrupt_prompt
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.train.forward import host_logprobs
from rlpost.llm.train.hooks.base import STEP_HOOKS, SettingsHook


@dataclass(frozen=True)
class RAC:
    rank: float = 0.1
    """Weight of the ranking-aware group loss."""
    pair: float = 0.1
    """Weight of the clean/corrupted pairwise loss (0: no corrupted forward)."""
    margin: float = 0.0
    """Hinge margin of both losses (0: zero loss exactly when the orders agree)."""
    pair_sample: bool = True
    """The corrupted side: the policy's own sample on the corrupted prompt (True) or the
    row's response re-scored under it (False)."""
    mask_rate: float = 0.5
    """Share of a prompt's digits masked in its corrupted copy."""
    mask: str = " "
    """What replaces a masked digit."""

    def __post_init__(self) -> None:
        if self.rank < 0 or self.pair < 0 or self.rank + self.pair == 0:
            raise ValueError(f"rank and pair must be >= 0, one > 0; got {self.rank}, {self.pair}")
        if not 0 < self.mask_rate <= 1:
            raise ValueError(f"mask_rate must be in (0, 1], got {self.mask_rate}")


@STEP_HOOKS.register
class RacHook(SettingsHook):
    name = "rac"
    setting = "rac"
    settings = RAC
    label = "algo.rac (RAC's confidence losses)"
    example = ("algo.rac={}",)
    declares = Declares(
        requires={
            Property.WHOLE_GROUPS: "ranks the responses of each group against each other",
            Property.ONE_PROCESS: "runs the corrupted forward outside the data-parallel wrapper",
            Property.SINGLE_TURN: "corrupts single-turn prompts",
            Property.SAME_THREAD: "samples the corrupted prompts with the engine between updates",
        }
    )

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self._corrupt: Any = None  # this step's corrupted rows (provide)

    def corrupted(self, step: Any) -> list[list[int]]:
        """Every row's prompt corrupted (seeded by run, step and row), encoded."""
        t, p = self.trainer, self.params
        out = []
        for i, e in enumerate(step.col.examples):
            rng = random.Random((t.cfg.run.seed * 1_000_003 + t.step) * 100_003 + i)
            out.append(encode_prompt(t.tok, corrupt_prompt(e.prompt, p.mask_rate, rng, p.mask)))
        return out

    def provide(self, step: Any) -> None:
        """The corrupted side of every row: its response under the corrupted prompt, or
        the policy's own answer to it (one sample per row)."""
        self._corrupt = None
        if self.params.pair <= 0:
            return
        t, prompts = self.trainer, self.corrupted(step)
        if self.params.pair_sample:
            self._corrupt = t.engine.generate(prompts, 1, t.sampling)
        else:
            self._corrupt = dataclasses.replace(step.batch, prompt_ids=prompts)

    def extra_loss(self, mb: Any, logp: Tensor, acc: Any) -> Tensor | None:
        t, p, step = self.trainer, self.params, mb.step
        m = step.mask[mb.idx]
        conf = sequence_confidence(logp, m)
        loss = logp.new_zeros(())
        if p.rank > 0:
            q = step.col.rewards[mb.idx].to(conf.device)
            rank = ranking_loss(conf, q, mb.sub.group.to(conf.device), p.margin)
            loss = loss + p.rank * rank / step.col.n_groups()
            acc.add({"rac/rank_loss": float(rank.detach()) / max(int(mb.sub.group.max()) + 1, 1)})
        if p.pair > 0:
            sub = self._corrupt.select(mb.idx)
            mc = sub.mask if self.params.pair_sample else m
            impl = t.cfg.model.logprob_impl
            logp_c = host_logprobs(t.model, t.forwards.seq_batch(sub), t.sampling.temperature,
                                   impl=impl)[0]  # fmt: skip
            conf_c = sequence_confidence(logp_c, mc.to(logp_c.device))
            pair = corruption_loss(conf, conf_c, p.margin)
            loss = loss + p.pair * pair / len(step.col.rewards)
            acc.add({"rac/pair_loss": float(pair.detach()) / len(conf),
                     "rac/confidence_drop": float((conf - conf_c).detach().mean())})  # fmt: skip
        return loss
