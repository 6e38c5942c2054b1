"""Token weights from attention entropy (catalog 001-08): the functions of
:mod:`.attention` and the ``TOKEN_WEIGHTINGS`` registry built on them (:mod:`.choices`:
anchors, explorers, random_subset, dynamic)."""

from rlpost.core.weights import choices  # noqa: F401  (registration)
from rlpost.core.weights.attention import (
    AnchorExplorerMasks,
    TokenSubset,
    anchor_explorer_masks,
    attention_entropy,
    dynamic_entropy_weights,
    random_token_subset,
)
from rlpost.core.weights.base import TOKEN_WEIGHTINGS, TokenWeightInput, TokenWeightOutput

__all__ = [
    "TOKEN_WEIGHTINGS",
    "AnchorExplorerMasks",
    "TokenSubset",
    "TokenWeightInput",
    "TokenWeightOutput",
    "anchor_explorer_masks",
    "attention_entropy",
    "dynamic_entropy_weights",
    "random_token_subset",
]
