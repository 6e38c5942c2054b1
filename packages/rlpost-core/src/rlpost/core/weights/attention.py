"""Token weights from attention entropy: anchors, explorers, soft reweighting (catalog 001-08).

Attention entropy measures how concentrated the contextual support of a token is: the
entropy of the attention row of the query that produces it, averaged over heads (and
layers). *Anchors* are the low-entropy tokens (concentrated support: stable gradients
aligned with the full-token update), *explorers* the high-entropy ones (diffuse support:
larger, more volatile gradients). Plain functions (the ``TOKEN_WEIGHTINGS`` entries of :mod:`rlpost.core.weights` wrap them); every result is detached
and ``[B, T]`` like the policy loss, so it plugs into
``PolicyBatch.token_weights`` or into ``mask``:

* :func:`attention_entropy`: ``[B, H, T, S]`` maps (or a tuple of layers, as Hugging Face
  returns with ``output_attentions=True``) -> ``[B, T]`` entropy in nats.
* :func:`anchor_explorer_masks`: the lowest / highest ``quantile`` of valid tokens.
* :func:`random_token_subset`: a Bernoulli(``frac``) subset with weights ``1 / frac``, the
  unbiased sparse estimator of the sum-aggregated token loss.
* :func:`dynamic_entropy_weights`: ``w ∝ exp(lam(progress) z(H))``, mean 1 over valid tokens.

Alignment: the logit of response token ``y_t`` comes from the query one position earlier,
so for a sequence with ``P`` prompt tokens the response tokens' entropies are
``attention_entropy(att)[:, P - 1 : -1]`` (slice the same way as the logits).

Deliberately left out: position normalisation of the entropy (a causal query at position
``t`` sees ``t + 1`` keys, so its entropy is at most ``log(t + 1)``); the abstract reports
that position does not explain the anchor / explorer asymmetry, and a caller who wants it
can divide by ``log`` of the key count before calling the functions below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rlpost.core.masked import masked_whiten

CHUNK_ELEMENTS = 1 << 26  # float32 working copy per chunk: 256 MB


@torch.no_grad()
def attention_entropy(
    attentions: Tensor | Sequence[Tensor],
    query_mask: Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """Mean attention entropy of each query, ``[B, T]`` (nats, detached, float32).

    H[b, t] = mean over layers l and heads h of  -sum_s p[b, h, t, s] log p[b, h, t, s]

    ``attentions``: one ``[B, H, T, S]`` map or a sequence of them (one per layer). Each row
    is renormalised to sum 1 over the keys (Hugging Face rows already do, up to bf16
    rounding); ``0 log 0 = 0``, so masked keys do not count, a uniform row over ``k`` keys
    gives ``log k`` and a one-hot row 0. Rows that are all zero (or NaN) give 0.
    ``query_mask`` ``[B, T]``: entropies of masked queries are set to 0.

    Memory: layers are processed one at a time and each in chunks of heads of at most
    ``chunk_elements`` elements (at least one head), with a single float32 working copy
    per chunk updated in place (clean, normalise, ``xlogy``); the input maps are never
    modified. Peak extra memory is one chunk plus ``[B, T]`` accumulators, not several
    float32 copies of a whole ``[B, H, T, S]`` layer.
    """
    layers = [attentions] if isinstance(attentions, Tensor) else list(attentions)
    if not layers:
        raise ValueError("attention_entropy: got no attention maps")
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    ref = tuple(layers[0].shape)
    total = None
    tiny = torch.finfo(torch.float32).tiny
    for i, a in enumerate(layers):  # loop over layers and head chunks, vectorised inside
        if a.dim() != 4 or (a.shape[0], a.shape[2]) != (ref[0], ref[2]):
            raise ValueError(
                f"attention_entropy: every layer must be [B, H, T, S] with the B and T of "
                f"layer 0 {ref}, layer {i} has shape {tuple(a.shape)}"
            )
        B, H, T, S = a.shape
        step = max(1, chunk_elements // max(1, B * T * S))  # heads per chunk
        h = torch.zeros(B, T, dtype=torch.float32, device=a.device)
        for h0 in range(0, H, step):
            p = a[:, h0 : h0 + step].to(torch.float32, copy=True)  # (B, h, T, S), own copy
            p.nan_to_num_(nan=0.0).clamp_min_(0.0)
            p.div_(p.sum(-1, keepdim=True).clamp_min_(tiny))
            h -= p.xlogy_(p).sum(-1).sum(1)  # -sum_s p log p, summed over the chunk's heads
        h = h.clamp_min_(0.0) / H  # (B, T): mean over heads
        total = h if total is None else total.add_(h)
    ent = total / len(layers)
    if query_mask is not None:
        if query_mask.shape != ent.shape:
            raise ValueError(
                f"query_mask must be [B, T] {tuple(ent.shape)}, got {tuple(query_mask.shape)}"
            )
        ent = ent * query_mask.to(ent.dtype)
    return ent


class AnchorExplorerMasks(NamedTuple):
    """Disjoint bool ``[B, T]`` subsets of the valid tokens."""

    anchors: Tensor  # the k lowest-entropy valid tokens
    explorers: Tensor  # the k highest-entropy valid tokens


def _ranks(x: Tensor, valid: Tensor) -> Tensor:
    """Ascending rank of each valid element in its row (ties by position); invalid last."""
    key = torch.where(valid, x, torch.full_like(x, float("inf")))
    order = key.argsort(dim=1, stable=True)
    pos = torch.arange(x.shape[1], device=x.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, pos)


def anchor_explorer_masks(
    entropy: Tensor, mask: Tensor, quantile: float = 0.2, per_sequence: bool = False
) -> AnchorExplorerMasks:
    """Anchors (lowest attention entropy) and explorers (highest) among the valid tokens.

    With ``n`` valid tokens (over the whole batch, or per row when ``per_sequence``) and
    ``k = round(quantile * n)``: anchors are the ``k`` lowest-entropy tokens, explorers the
    ``min(k, n - k)`` highest, so the two never overlap. Rank-based (ties broken by position),
    so each subset has exactly its size even with repeated entropies. ``entropy``, ``mask``:
    ``[B, T]``; ``quantile`` in (0, 0.5].
    """
    if not 0.0 < quantile <= 0.5:
        raise ValueError(f"quantile must be in (0, 0.5], got {quantile}")
    if entropy.shape != mask.shape or entropy.dim() != 2:
        raise ValueError(
            f"entropy and mask must both be [B, T], got {tuple(entropy.shape)} and "
            f"{tuple(mask.shape)}"
        )
    valid = mask.bool()
    rows = valid.shape if per_sequence else (1, valid.numel())
    x, v = entropy.detach().float().reshape(rows), valid.reshape(rows)
    rank = _ranks(x, v)
    n = v.sum(1, keepdim=True)
    k = torch.floor(quantile * n + 0.5).long()
    k_high = torch.minimum(k, n - k)
    anchors = v & (rank < k)
    explorers = v & (rank >= n - k_high)
    return AnchorExplorerMasks(anchors.reshape(valid.shape), explorers.reshape(valid.shape))


class TokenSubset(NamedTuple):
    """A random token subset: bool ``mask`` ``[B, T]`` and ``weights`` = mask / frac."""

    mask: Tensor
    weights: Tensor


def random_token_subset(
    mask: Tensor, frac: float, generator: torch.Generator | None = None
) -> TokenSubset:
    """Keep each valid token independently with probability ``frac``; weight kept ones 1/frac.

    E[weights] = mask, so for any per-token loss l the weighted sum sum_t w_t l_t (and its
    gradient) is an unbiased estimate of the full masked sum sum_t m_t l_t. Use it as
    ``PolicyBatch(..., token_weights=subset.weights, global_tokens=<full token count>)``:
    the normaliser must stay the full batch's count (dividing by the subset's own size
    would be a biased ratio estimator). ``generator`` must live on ``mask``'s device.
    """
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"frac must be in (0, 1], got {frac}")
    u = torch.rand(mask.shape, generator=generator, device=mask.device)
    keep = (u < frac) & mask.bool()
    return TokenSubset(keep, keep.float() / frac)


@torch.no_grad()
def dynamic_entropy_weights(
    entropy: Tensor,
    mask: Tensor,
    progress: float,
    lam_start: float = -1.0,
    lam_end: float = 1.0,
    z_clip: float = 3.0,
    eps: float = 1e-6,
) -> Tensor:
    """Soft attention-entropy reweighting with a linear schedule, ``[B, T]`` (detached).

        lam = lam_start + (lam_end - lam_start) * progress
        z   = clip((H - mean H) / (std H + eps), -z_clip, z_clip)   over valid tokens
        w   = exp(lam z) / mean_valid exp(lam z)      (mean 1 on valid tokens, 0 on masked)

    Our reading of the abstract's "dynamic entropy-aware soft reweighting": lam < 0
    up-weights anchors (the stable backbone) early and lam > 0 shifts weight to explorers
    (the hard-reasoning signal) later; lam = 0 is uniform token averaging. ``z_clip``
    bounds the largest weight ratio by exp(2 |lam| z_clip). Statistics are batch-wide:
    compute on the whole step's batch, then slice per micro-batch.
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must be in [0, 1], got {progress}")
    if z_clip <= 0:
        raise ValueError(f"z_clip must be > 0, got {z_clip}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must match")
    lam = lam_start + (lam_end - lam_start) * progress
    m = mask.float()
    z = masked_whiten(entropy.float(), m, eps=eps).clamp(-z_clip, z_clip)
    logits = torch.where(m > 0, lam * z, torch.full_like(z, -float("inf")))
    w = torch.exp(logits - logits.max()) if m.any() else torch.zeros_like(z)
    return w * m.sum() / w.sum().clamp_min(torch.finfo(w.dtype).tiny)
