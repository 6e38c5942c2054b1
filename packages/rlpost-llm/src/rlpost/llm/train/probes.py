"""No-grad probes of the policy behind the trainer's optional contract inputs (the input
providers of :mod:`rlpost.llm.train.providers` call them, only when an entry reads one):

* :func:`pooled_hidden`: prompt / completion features (BASIS, GCPO);
* :func:`attention_token_entropy`: per-token attention entropy (token weightings, 001-08);
* :func:`token_distributions`: both policies' per-token top-K (predictive divergence mask).

(A²TGPO's information gain, a probe of multi-turn episodes, is
:func:`rlpost.llm.rollout.sources.episodes.information_gain`.)

All run without gradient, in eval mode, in micro-batches, on the model's device, and
return CPU tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from rlpost.core.ratios import TokenDistributions
from rlpost.core.weights import attention_entropy
from rlpost.llm.model.policy import (
    eval_mode,
    fused_head,
    make_seq_batch,
    sampled_index,
)
from rlpost.llm.rollout.engines.base import RolloutBatch


def _slices(n: int, size: int) -> Iterator[slice]:
    for s in range(0, n, size):
        yield slice(s, s + size)


@torch.no_grad()
def pooled_hidden(
    model: torch.nn.Module, batch: RolloutBatch, part: str, micro_batch: int
) -> Tensor:
    """``[N, H]`` (CPU, float32) mean of the last hidden states over the prompt or the
    completion tokens (``part``). Uses the decoder alone when the model has one (no logits,
    no per-layer states kept); every rank computes all rows, so ranks agree."""
    if part not in ("prompt", "completion"):
        raise ValueError(f"part must be 'prompt' or 'completion', got {part!r}")
    dec = fused_head(model)
    body = dec[0] if dec is not None else model
    dev = next(model.parameters()).device
    out = []
    with eval_mode(model):
        for sl in _slices(len(batch), micro_batch):
            sb = make_seq_batch(
                batch.prompt_ids[sl], batch.completion_ids[sl], batch.mask[sl], batch.pad_id,
                attend=batch.attention[sl],
            )  # fmt: skip
            res = body(
                input_ids=sb.input_ids.to(dev),
                attention_mask=sb.attention_mask.to(dev),
                position_ids=sb.position_ids.to(dev),
                output_hidden_states=dec is None,
            )
            h = res.last_hidden_state if dec is not None else res.hidden_states[-1]
            cols = slice(0, sb.P) if part == "prompt" else slice(sb.P, None)
            w = sb.attention_mask[:, cols].to(dev, h.dtype)[..., None]
            out.append(((h[:, cols] * w).sum(1) / w.sum(1).clamp_min(1.0)).float().cpu())
    return torch.cat(out)


@contextlib.contextmanager
def _eager_attention(model: torch.nn.Module) -> Iterator[None]:
    """Eager attention for the duration (the only implementation that returns the maps)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    setter = getattr(base, "set_attn_implementation", None)
    before = getattr(getattr(base, "config", None), "_attn_implementation", None)
    if setter is None:
        raise ValueError(f"{type(base).__name__} cannot switch to eager attention")
    setter("eager")
    try:
        yield
    finally:
        if before is not None:
            setter(before)


@torch.no_grad()
def attention_token_entropy(
    model: torch.nn.Module, batch: RolloutBatch, micro_batch: int
) -> Tensor:
    """``[N, L]`` mean attention entropy (over layers and heads) of the query that produces
    each completion token, 0 on padding (:func:`rlpost.core.weights.attention_entropy`)."""
    dev = next(model.parameters()).device
    out = []
    with eval_mode(model), _eager_attention(model):
        for sl in _slices(len(batch), micro_batch):
            sb = make_seq_batch(
                batch.prompt_ids[sl], batch.completion_ids[sl], batch.mask[sl], batch.pad_id,
                attend=batch.attention[sl],
            )  # fmt: skip
            res = model(
                input_ids=sb.input_ids.to(dev),
                attention_mask=sb.attention_mask.to(dev),
                position_ids=sb.position_ids.to(dev),
                output_attentions=True,
                use_cache=False,
                logits_to_keep=1,
            )
            L = sb.targets.shape[1]
            h = attention_entropy(res.attentions)[:, sb.P - 1 : sb.P - 1 + L]  # [b, L]
            out.append(h.float().cpu() * batch.mask[sl])
    return torch.cat(out)


def token_distributions(
    current: tuple[Tensor, Tensor], behaviour: tuple[Tensor, Tensor], targets: Tensor
) -> TokenDistributions:
    """Both policies over the behaviour policy's top-K ids: ``current`` / ``behaviour`` are
    ``(ids, logp)`` ``[B, L, K]`` on the same ids (``completion_logprobs(dists=...)``),
    ``targets`` ``[B, L]`` the sampled tokens (column among the ids, -1 if absent)."""
    ids, cur = current
    b_ids, old = behaviour
    if not torch.equal(ids.cpu(), b_ids.cpu()):
        raise ValueError("current and behaviour distributions must be over the same ids")
    col = sampled_index(ids.cpu(), targets.cpu())
    return TokenDistributions(cur.detach().cpu(), old.detach().cpu(), col)
