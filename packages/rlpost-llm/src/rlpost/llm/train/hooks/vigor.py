"""VIGOR (001-03): the step's rewards from the policy's own per-sample gradient norms
(``algo.vigor``; :mod:`rlpost.core.intrinsic`).

Before the advantages, each completion's teacher-forced mean-NLL gradient norm under the
current parameters is computed, batched (:func:`rlpost.llm.model.per_sample.grad_norms`),
multiplied by ``sqrt(T)`` and turned into a reward by its rank within the group (the
smallest norm, 1). With ``mix > 0`` the run's own reward, times ``mix``, is added
(``mix: 0``: verifier-free, VIGOR's setting). ``signal: confidence`` ranks by the
completion's mean token log-probability instead (the RLIF-style self-certainty baseline
the paper compares against, for ablation). Logged: ``vigor/grad_norm`` and
``vigor/score`` (means), ``vigor/length_corr`` (the correlation of score and length over
the step's rows) and ``vigor/agreement`` (of the verifier's reward with VIGOR's, in
groups where both vary: the share of ordered pairs they order alike)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from rlpost.core.confidence import sequence_confidence
from rlpost.core.contract import Declares, Property
from rlpost.core.intrinsic import group_rank_rewards, length_corrected
from rlpost.llm.model.per_sample import grad_norms
from rlpost.llm.train.hooks.base import STEP_HOOKS, SettingsHook
from rlpost.llm.train.inputs import Role


@dataclass(frozen=True)
class Vigor:
    signal: Literal["grad_norm", "confidence"] = "grad_norm"
    """``grad_norm``: VIGOR's; ``confidence``: the RLIF-style baseline the paper compares
    against, the completion's mean token log-probability under the sampling policy (the
    most self-certain, 1), for ablation."""
    mix: float = 0.0
    """Weight of the run's own reward added to VIGOR's (0: verifier-free)."""
    length_correction: bool = True
    """Multiply each gradient norm by sqrt(T) (False: the raw norm, for ablation)."""
    chunk: int = 8
    """Rows whose per-sample gradients are held at once."""

    def __post_init__(self) -> None:
        if self.mix < 0:
            raise ValueError(f"mix must be >= 0, got {self.mix}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")


def pair_agreement(a: Tensor, b: Tensor, group: Tensor) -> float:
    """The share of a group's pairs ordered strictly by both ``a`` and ``b`` that they order
    the same way (NaN: none)."""
    same = group[:, None] == group[None, :]
    da, db = torch.sign(a[:, None] - a[None, :]), torch.sign(b[:, None] - b[None, :])
    both = same & (da != 0) & (db != 0)
    return float((da == db)[both].float().mean()) if both.any() else float("nan")


@STEP_HOOKS.register
class VigorHook(SettingsHook):
    name = "vigor"
    setting = "vigor"
    settings = Vigor
    label = "algo.vigor (VIGOR's intrinsic reward)"
    order = 15  # after the batch provider's rewards, before anything reads them
    example = ("algo.vigor={}",)
    declares = Declares(
        requires={
            Property.UNSHARDED: "takes per-sample gradients of the whole weights",
            Property.SINGLE_TURN: "scores single-turn completions",
        }
    )

    def provide(self, step: Any) -> None:
        t, p, b = self.trainer, self.params, step.batch
        lengths = b.mask.sum(1)
        if p.signal == "confidence":  # (a smaller score is better: minus the confidence)
            norms = -sequence_confidence(b.logprobs, b.mask)
            scores = norms
        else:
            sb = t.forwards.seq_batch(b, pack=False)
            norms = grad_norms(t.model, sb, b.mask, t.sampling.temperature, p.chunk)
            scores = length_corrected(norms, lengths) if p.length_correction else norms
        own = group_rank_rewards(scores, b.group)
        verifier = step[Role.REWARDS]
        step[Role.REWARDS] = own + p.mix * verifier if p.mix else own
        corr = torch.corrcoef(torch.stack([scores, lengths.float()]))[0, 1]
        step.metrics.update({
            "vigor/grad_norm": float(norms.mean()),
            "vigor/score": float(scores.mean()),
            "vigor/length_corr": float(corr) if torch.isfinite(corr) else 0.0,
            "vigor/agreement": pair_agreement(own, verifier, b.group),
        })  # fmt: skip
