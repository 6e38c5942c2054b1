"""RAC (000-19): the ranking-aware and the clean/corrupted confidence losses added to the
policy loss (``algo.rac``), on the policy's own confidence, the mean token log-probability
of a response (:mod:`rlpost.core.confidence`).

Per micro-batch of whole groups: ``rank x ranking_loss / groups`` (a better response of a
group must be more confident than a worse one) and ``pair x corruption_loss / responses``
(each response must be less confident given its prompt with digits masked,
:mod:`rlpost.llm.data.corruption`; one more differentiable forward of the micro-batch),
normalised by the step's groups and responses so that micro-batches add up to the full
batch. Logged: ``rac/rank_loss``, ``rac/pair_loss`` and ``rac/confidence_drop`` (the mean
of clean minus corrupted confidence)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rlpost.core.confidence import corruption_loss, ranking_loss, sequence_confidence
from rlpost.core.contract import Declares, Property
from rlpost.core.registry import make_params
from rlpost.llm.data.corruption import corrupt_prompt
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.train.forward import host_logprobs
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


@dataclass(frozen=True)
class RAC:
    rank: float = 0.1
    """Weight of the ranking-aware group loss."""
    pair: float = 0.1
    """Weight of the clean/corrupted pairwise loss (0: no corrupted forward)."""
    margin: float = 0.0
    """Hinge margin of both losses (0: zero loss exactly when the orders agree)."""
    mask_rate: float = 0.5
    """Share of a prompt's digits masked in its corrupted copy."""
    mask: str = " "
    """What replaces a masked digit."""

    def __post_init__(self) -> None:
        if self.rank < 0 or self.pair < 0 or self.rank + self.pair == 0:
            raise ValueError(f"rank and pair must be >= 0, one > 0; got {self.rank}, {self.pair}")
        if not 0 < self.mask_rate <= 1:
            raise ValueError(f"mask_rate must be in (0, 1], got {self.mask_rate}")


def params_of(cfg: Any) -> RAC:
    value = cfg.algo.rac
    return make_params(RAC, "algo.rac", dict(value) if isinstance(value, dict) else {})


@STEP_HOOKS.register
class RacHook(StepHook):
    name = "rac"
    label = "algo.rac (RAC's confidence losses)"
    example = ("algo.rac={}",)
    declares = Declares(
        requires={
            Property.WHOLE_GROUPS: "ranks the responses of each group against each other",
            Property.ONE_PROCESS: "runs the corrupted forward outside the data-parallel wrapper",
            Property.SINGLE_TURN: "corrupts single-turn prompts",
        }
    )

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return cfg.algo.rac not in (None, False)

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        params_of(cfg)

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.params = params_of(trainer.cfg)

    def corrupted(self, mb: Any) -> Any:
        """The micro-batch's rows with their prompts corrupted (seeded by run, step, row)."""
        t, p = self.trainer, self.params
        out = []
        for i in mb.idx.tolist():
            rng = random.Random((t.cfg.run.seed * 1_000_003 + t.step) * 100_003 + i)
            e = mb.step.col.examples[i]
            out.append(encode_prompt(t.tok, corrupt_prompt(e.prompt, p.mask_rate, rng, p.mask)))
        return dataclasses.replace(mb.sub, prompt_ids=out)

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
            sb = t.forwards.seq_batch(self.corrupted(mb))
            impl = t.cfg.model.logprob_impl
            conf_c = sequence_confidence(host_logprobs(t.model, sb, t.sampling.temperature,
                                                       impl=impl)[0], m)  # fmt: skip
            pair = corruption_loss(conf, conf_c, p.margin)
            loss = loss + p.pair * pair / len(step.col.rewards)
            acc.add({"rac/pair_loss": float(pair.detach()) / len(conf),
                     "rac/confidence_drop": float((conf - conf_c).detach().mean())})  # fmt: skip
        return loss
