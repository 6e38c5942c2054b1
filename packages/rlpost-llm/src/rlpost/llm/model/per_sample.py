"""Per-sample gradients of a causal LM's teacher-forced loss, batched.

:func:`row_grads` yields every row's gradient of a padded sequence batch over the
trainable parameters, and :func:`grad_norms` their L2 norms, with ``torch.func``:
``vmap`` of ``grad`` of a ``functional_call``, ``chunk`` rows at once (their per-sample
gradients are what a chunk holds in memory), no Python loop of backward passes. Each row
attends through an explicit 4D mask (causal, its own padding left out), since the
model's own mask handling branches on the data, which ``vmap`` cannot trace.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from rlpost.llm.model.policy import SeqBatch


def _row_masks(attn: Tensor, sdpa: bool, dtype: torch.dtype) -> Tensor:
    """``[B, 1, S, S]``: causal over each row's real tokens (a padded query position
    attends to itself, so no softmax row is empty)."""
    S = attn.shape[1]
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool, device=attn.device))
    allow = (causal[None] & attn.bool()[:, None, :]) | torch.eye(
        S, dtype=torch.bool, device=attn.device
    )
    allow = allow[:, None]
    if sdpa:
        return allow
    zero = torch.zeros((), dtype=dtype, device=attn.device)
    return torch.where(allow, zero, torch.finfo(dtype).min)


def grad_norms(
    model: torch.nn.Module, sb: SeqBatch, mask: Tensor, temperature: float = 1.0, chunk: int = 8
) -> Tensor:
    """``[B]``: the L2 norm of each row's gradient of its mean token NLL (the completion
    tokens where ``mask`` ``[B, L]`` is 1, at ``temperature``) over the trainable
    parameters, under the model's current weights."""
    out = [g.square().sum(1).sqrt() for g in row_grads(model, sb, mask, temperature, chunk)]
    # (not g.norm(dim=1): on the CPU its float32 reduction is off by ~1e-4 at 1e6 entries)
    return torch.cat(out).cpu()


def row_grads(
    model: torch.nn.Module,
    sb: SeqBatch,
    mask: Tensor,
    temperature: float = 1.0,
    chunk: int = 8,
    mean: bool = True,
):
    """Each chunk's per-row gradients, ``[rows, D]`` float32 (every trainable parameter,
    flattened in ``named_parameters`` order), of the row's token NLL over the completion
    tokens where ``mask`` is 1: its mean (``mean``), or its sum (``-grad log pi(y | x)``)."""
    dev = next(model.parameters()).device
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    frozen.update(dict(model.named_buffers()))
    sdpa = getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"
    dtype = next(model.parameters()).dtype
    P, L = sb.P, sb.targets.shape[1]

    def loss(p, ids, allow, pos, tgt, m):
        out = functional_call(model, {**frozen, **p}, (ids[None],),
                              {"attention_mask": allow[None], "position_ids": pos[None],
                               "use_cache": False})  # fmt: skip
        logits = out.logits[0, P - 1 : P - 1 + L].float() / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, tgt[:, None])[:, 0]
        return -(lp * m).sum() / (m.sum().clamp_min(1.0) if mean else 1.0)

    per_row = vmap(grad(loss), in_dims=(None, 0, 0, 0, 0, 0))
    was = model.training
    model.eval()  # (no dropout: the same function for every row)
    try:
        with warnings.catch_warnings():  # (vmap loops SDPA on the CPU: slower, still exact)
            warnings.filterwarnings("ignore", message="There is a performance drop")
            for s in range(0, sb.input_ids.shape[0], chunk):
                sl = slice(s, s + chunk)
                attn = sb.attention_mask[sl].to(dev)
                g = per_row(params, sb.input_ids[sl].to(dev), _row_masks(attn, sdpa, dtype),
                            sb.position_ids[sl].to(dev), sb.targets[sl].to(dev),
                            mask[sl].to(dev).float())  # fmt: skip
                yield torch.cat([v.float().flatten(1) for v in g.values()], 1)
    finally:
        model.train(was)
