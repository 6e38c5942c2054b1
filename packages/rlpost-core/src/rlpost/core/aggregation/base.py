"""Loss aggregation: per-token loss matrix -> scalar, correct under micro-batching.

Signature ``fn(AggregationInput, params) -> AggregationOutput``.

Why global counts: a step's batch is split into micro-batches (and across devices), and
gradients are *summed* over them. If each micro-batch divided by its own token count,
the result would depend on how the batch was split (a micro-batch of short responses
would get the same weight as one of long responses). Every mode here therefore divides
by a count of the *whole* step's batch — ``global_tokens`` (valid tokens) or
``global_sequences`` (responses) — which the trainer computes once before the
micro-batch loop; then sum over micro-batches == the full-batch value, exactly.
When they are omitted, the counts of this call's batch are used (a single micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.registry import Registry


@dataclass(frozen=True)
class AggregationInput:
    loss: Tensor  # [B, T] per-token loss
    mask: Tensor  # [B, T]
    global_tokens: float | None = None  # valid tokens in the whole step's batch
    global_sequences: float | None = None  # responses in the whole step's batch
    generation_budget: float | None = None  # max new tokens per response (constant normaliser)

    def __post_init__(self) -> None:
        if self.loss.shape != self.mask.shape or self.loss.dim() != 2:
            raise ValueError(
                f"loss and mask must both be [B, T]; got {tuple(self.loss.shape)}, "
                f"{tuple(self.mask.shape)}"
            )

    def tokens(self) -> float:
        n = self.global_tokens if self.global_tokens is not None else self.mask.sum().item()
        return max(float(n), 1.0)

    def sequences(self) -> float:
        n = self.global_sequences if self.global_sequences is not None else self.mask.shape[0]
        return max(float(n), 1.0)


@dataclass(frozen=True)
class AggregationOutput:
    loss: Tensor  # scalar


AGGREGATIONS: Registry[AggregationInput, AggregationOutput] = Registry(
    "loss aggregation",
    AggregationInput,
    AggregationOutput,
    inputs={Input.GENERATION_BUDGET: ("generation_budget",)},
    gated=(Input.GENERATION_BUDGET,),
)


def _masked(inp: AggregationInput) -> Tensor:
    return inp.loss * inp.mask.to(inp.loss.dtype)


def count_scale(
    aggregation,
    global_tokens: float,
    global_sequences: float,
    generation_budget: float | None = None,
) -> float:
    """The factor that turns a loss aggregated with unit global counts
    (``global_tokens = global_sequences = 1``) into the same loss aggregated with these
    counts, and so its gradient too.

    A deferred normaliser (RolloutPipe, 004-30, back-propagates a chunk of complete groups
    before the rest of the step's batch exists, so before its counts are known). Every
    entry divides a sum over its own rows by a function of the global counts alone, so the
    factor is the same for any rows; it is read off the entry itself on a one-token probe
    (``aggregation``: an ``AGGREGATIONS`` entry, built). The contract tests check, for
    every registered entry, that ``agg(counts) == count_scale(...) * agg(1, 1)`` on random
    losses: an entry of any other form fails them.
    """

    def probe(tokens: float, sequences: float) -> float:
        one = torch.ones(1, 1, dtype=torch.float64)
        inp = AggregationInput(one, one, tokens, sequences, generation_budget)
        return float(aggregation(inp).loss)

    return probe(global_tokens, global_sequences) / probe(1.0, 1.0)
