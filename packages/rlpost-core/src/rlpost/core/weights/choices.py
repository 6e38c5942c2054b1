"""The ``TOKEN_WEIGHTINGS`` entries of catalog 001-08: anchors, explorers, a random subset
and the dynamic soft reweighting."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.core.contract import Coupling, Input
from rlpost.core.weights.attention import (
    anchor_explorer_masks,
    dynamic_entropy_weights,
    random_token_subset,
)
from rlpost.core.weights.base import TOKEN_WEIGHTINGS, TokenWeightInput, TokenWeightOutput


@dataclass(frozen=True)
class SubsetParams:
    quantile: float = 0.2  # fraction of the valid tokens kept
    per_sequence: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 0.5:
            raise ValueError(f"quantile must be in (0, 0.5], got {self.quantile}")


def _subset(inp: TokenWeightInput, p: SubsetParams, which: str) -> TokenWeightOutput:
    masks = anchor_explorer_masks(inp.entropy, inp.mask, p.quantile, p.per_sequence)
    keep = getattr(masks, which).float()
    m = inp.mask.float()
    return TokenWeightOutput(keep, {f"{which}_frac": float(keep.sum() / m.sum().clamp_min(1.0))})


@TOKEN_WEIGHTINGS.register("anchors", SubsetParams, coupling=Coupling.BATCH)
def anchors(inp: TokenWeightInput, p: SubsetParams) -> TokenWeightOutput:
    """Train on the anchors only: weight 1 on the ``quantile`` lowest-attention-entropy
    valid tokens (of the batch, or of each row with ``per_sequence``), 0 elsewhere."""
    return _subset(inp, p, "anchors")


@TOKEN_WEIGHTINGS.register("explorers", SubsetParams, coupling=Coupling.BATCH)
def explorers(inp: TokenWeightInput, p: SubsetParams) -> TokenWeightOutput:
    """Train on the explorers only: the ``quantile`` highest-entropy valid tokens."""
    return _subset(inp, p, "explorers")


@dataclass(frozen=True)
class RandomSubsetParams:
    frac: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.frac <= 1.0:
            raise ValueError(f"frac must be in (0, 1], got {self.frac}")


@TOKEN_WEIGHTINGS.register("random_subset", RandomSubsetParams)
def random_subset(inp: TokenWeightInput, p: RandomSubsetParams) -> TokenWeightOutput:
    """The abstract's sparse-estimability control: each valid token kept with probability
    ``frac`` and weighted ``1 / frac`` (unbiased; the global RNG draws it)."""
    sub = random_token_subset(inp.mask, p.frac)
    kept = float(sub.mask.sum() / inp.mask.float().sum().clamp_min(1.0))
    return TokenWeightOutput(sub.weights, {"random_subset_frac": kept})


@dataclass(frozen=True)
class DynamicParams:
    lam_start: float = -1.0  # anchors up-weighted early
    lam_end: float = 1.0  # explorers later
    z_clip: float = 3.0

    def __post_init__(self) -> None:
        if self.z_clip <= 0:
            raise ValueError(f"z_clip must be > 0, got {self.z_clip}")


@TOKEN_WEIGHTINGS.register(
    "dynamic", DynamicParams, needs={Input.DYNAMICS}, coupling=Coupling.BATCH
)
def dynamic(inp: TokenWeightInput, p: DynamicParams) -> TokenWeightOutput:
    """:func:`dynamic_entropy_weights` at the training progress of ``dynamics``: the
    abstract's dynamic entropy-aware soft reweighting (mean 1 over valid tokens)."""
    w = dynamic_entropy_weights(
        inp.entropy, inp.mask, inp.dynamics.progress, p.lam_start, p.lam_end, p.z_clip
    )
    m = inp.mask.bool()
    big = float(w[m].max()) if m.any() else 0.0
    return TokenWeightOutput(
        w, {"token_weight_max": big, "token_weight_mean": float(w[m].mean()) if m.any() else 0.0}
    )
