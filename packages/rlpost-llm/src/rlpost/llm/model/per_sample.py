"""Per-sample gradient norms of a causal LM's teacher-forced loss, batched.

:func:`grad_norms` gives, for every row of a padded sequence batch, ``||grad_theta
mean-NLL(row)||_2`` over the trainable parameters, with ``torch.func``: ``vmap`` of
``grad`` of a ``functional_call``, ``chunk`` rows at once (their per-sample gradients
are what a chunk holds in memory), no Python loop of backward passes. Each row attends
through an explicit 4D mask (causal, its own padding left out), since the model's own
mask handling branches on the data, which ``vmap`` cannot trace.
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
        return -(lp * m).sum() / m.sum().clamp_min(1.0)

    per_row = vmap(grad(loss), in_dims=(None, 0, 0, 0, 0, 0))
    out = []
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
                out.append(torch.sqrt(sum((v.float().flatten(1) ** 2).sum(1) for v in g.values())))
    finally:
        model.train(was)
    return torch.cat(out).cpu()
