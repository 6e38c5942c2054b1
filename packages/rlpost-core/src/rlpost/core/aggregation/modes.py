"""The four loss normalisations: token-mean, seq-mean-token-sum, seq-mean-token-mean,
constant (Dr. GRPO)."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.core.aggregation.base import AGGREGATIONS, AggregationInput, AggregationOutput, _masked
from rlpost.core.contract import Input
from rlpost.core.registry import NoParams


@AGGREGATIONS.register("token_mean", NoParams)
def token_mean(inp: AggregationInput, p: NoParams) -> AggregationOutput:
    """Token-level mean (DAPO, arXiv:2503.14476): L = sum_{i,t} m_it l_it / N_tokens(global).

    Every token weighs the same, so long responses are not down-weighted.
    """
    return AggregationOutput(_masked(inp).sum() / inp.tokens())


@AGGREGATIONS.register("seq_mean_token_sum", NoParams)
def seq_mean_token_sum(inp: AggregationInput, p: NoParams) -> AggregationOutput:
    """L = (1/N_seq) sum_i sum_t m_it l_it (sequence log-likelihood objective, e.g. RLOO)."""
    return AggregationOutput(_masked(inp).sum() / inp.sequences())


@AGGREGATIONS.register("seq_mean_token_mean", NoParams)
def seq_mean_token_mean(inp: AggregationInput, p: NoParams) -> AggregationOutput:
    """Original GRPO: L = (1/N_seq) sum_i (1/|y_i|) sum_t m_it l_it.

    The per-sequence length normaliser is local to each response, so splitting the batch
    by whole responses keeps the sum over micro-batches equal to the full batch.
    """
    per_seq = _masked(inp).sum(1) / inp.mask.to(inp.loss.dtype).sum(1).clamp_min(1.0)
    return AggregationOutput(per_seq.sum() / inp.sequences())


@dataclass(frozen=True)
class ConstantParams:
    # C; None: the trainer's generation budget (max new tokens per response), as Dr. GRPO
    normalizer: float | None = None

    def __post_init__(self) -> None:
        if self.normalizer is not None and self.normalizer <= 0:
            raise ValueError(f"normalizer must be > 0, got {self.normalizer}")


def _constant_needs(p: ConstantParams) -> set[Input]:
    return {Input.GENERATION_BUDGET} if p.normalizer is None else set()


@AGGREGATIONS.register("constant", ConstantParams, needs=_constant_needs)
def constant(inp: AggregationInput, p: ConstantParams) -> AggregationOutput:
    """Dr. GRPO constant normaliser (Liu et al. 2025, arXiv:2503.20783):

    L = (1 / (N_seq * C)) sum_{i,t} m_it l_it,  C a constant (the generation budget), so
    neither response length nor batch composition rescales any token's gradient.
    ``normalizer=None`` (the preset's): C is ``AggregationInput.generation_budget``, the
    trainer's maximum number of new tokens per response (declared: ``needs``).
    """
    c = p.normalizer if p.normalizer is not None else inp.generation_budget
    return AggregationOutput(_masked(inp).sum() / (inp.sequences() * max(float(c), 1.0)))
