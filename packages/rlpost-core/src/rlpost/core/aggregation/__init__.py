"""Loss aggregation (the ``AGGREGATIONS`` registry): per-token loss matrix -> scalar,
correct under micro-batching (global normalisers). Entries: :mod:`.modes`."""

from rlpost.core.aggregation import modes  # noqa: F401  (registration)
from rlpost.core.aggregation.base import (
    AGGREGATIONS,
    AggregationInput,
    AggregationOutput,
    count_scale,
)

__all__ = ["AGGREGATIONS", "AggregationInput", "AggregationOutput", "count_scale"]
