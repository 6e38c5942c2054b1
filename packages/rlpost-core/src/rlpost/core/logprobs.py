"""Log-probs of chosen tokens and entropy from logits, in chunks of rows.

A naive ``logits.float().log_softmax(-1)`` materialises a float32 ``[B, T, V]`` tensor
(for V = 151,936 that is 600 KB per token) and autograd keeps it for the backward pass.
Here a custom autograd function walks the rows in chunks: the forward keeps only
per-row scalars (log-sum-exp, entropy) and the input logits themselves; the backward
recomputes each chunk's softmax and writes the gradient straight into a tensor of the
logits' own dtype. Peak extra memory is O(chunk_size * V) float32 instead of
O(B * T * V).

Math, per row with z = logits / tau, log q = z - logsumexp(z), q = softmax(z):

    log p(y)  = z_y - logsumexp(z)
    H         = -sum_j q_j log q_j = logsumexp(z) - sum_j q_j z_j
    d log p(y) / d z_j = 1[j = y] - q_j
    d H / d z_j        = -q_j (log q_j + H)

and d/d logits = (1/tau) d/d z.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class LogProbEntropy(NamedTuple):
    logp: Tensor  # [...] float32 log-prob of each target token
    entropy: Tensor  # [...] float32 entropy of each row's distribution


class _ChunkedLogProbEntropy(torch.autograd.Function):
    """Row-chunked log-prob / entropy; at most two float32 ``(chunk, V)`` buffers live at once
    (elementwise steps run in place)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, chunk: int, tau: float):  # type: ignore[override]
        N = logits.shape[0]
        logp = logits.new_empty(N, dtype=torch.float32)
        ent = logits.new_empty(N, dtype=torch.float32)
        lse = logits.new_empty(N, dtype=torch.float32)
        for s in range(0, N, chunk):
            e = s + chunk
            z = logits[s:e].to(torch.float32, copy=True).div_(tau)  # (c, V) buffer 1
            lse_c = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(-1, targets[s:e, None]).squeeze(-1) - lse_c
            q = (z - lse_c[:, None]).exp_()  # (c, V) buffer 2: softmax
            ent[s:e] = lse_c - q.mul_(z).sum(-1)  # H = lse - sum_j q_j z_j
            lse[s:e] = lse_c
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.chunk, ctx.tau = chunk, tau
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: Tensor | None, g_ent: Tensor | None):  # type: ignore[override]
        logits, targets, lse, ent = ctx.saved_tensors
        chunk, tau = ctx.chunk, ctx.tau
        N = logits.shape[0]
        g_logp = torch.zeros(N, device=logits.device) if g_logp is None else g_logp
        g_ent = torch.zeros(N, device=logits.device) if g_ent is None else g_ent
        grad = torch.empty_like(logits)
        for s in range(0, N, chunk):
            e = s + chunk
            logq = (
                logits[s:e].to(torch.float32, copy=True).div_(tau).sub_(lse[s:e, None])
            )  # buffer 1
            q = logq.exp()  # buffer 2
            # dL/dz_j = g_logp (1[j=y] - q_j) - g_ent q_j (log q_j + H)
            #         = -q_j (g_logp + g_ent (log q_j + H)) + g_logp 1[j=y]
            coef = logq.add_(ent[s:e, None]).mul_(g_ent[s:e, None]).add_(g_logp[s:e, None])
            g = q.mul_(coef).neg_()
            g.scatter_add_(-1, targets[s:e, None], g_logp[s:e, None])
            grad[s:e] = g.div_(tau)
        return grad, None, None, None


def logprobs_and_entropy(
    logits: Tensor, targets: Tensor, chunk_size: int = 256, temperature: float = 1.0
) -> LogProbEntropy:
    """Log-prob of ``targets`` and entropy, never materialising a float32 ``[..., V]`` copy.

    ``logits``: ``[..., V]`` (any float dtype; bf16 stays bf16), ``targets``: ``[...]`` int.
    Returns float32 ``[...]`` tensors, differentiable w.r.t. ``logits``.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets shape {tuple(targets.shape)} must equal logits.shape[:-1] "
            f"{tuple(logits.shape[:-1])}"
        )
    if chunk_size < 1 or temperature <= 0:
        raise ValueError("chunk_size must be >= 1 and temperature > 0")
    lead = targets.shape
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V), a view when contiguous
    logp, ent = _ChunkedLogProbEntropy.apply(
        flat, targets.reshape(-1).long(), chunk_size, temperature
    )
    return LogProbEntropy(logp.view(lead), ent.view(lead))


def logprobs_from_logits(logits: Tensor, targets: Tensor, chunk_size: int = 256) -> Tensor:
    """``[..., V], [...] -> [...]`` float32 log-probs of ``targets`` (chunked)."""
    return logprobs_and_entropy(logits, targets, chunk_size).logp


def entropy_from_logits(logits: Tensor, chunk_size: int = 256) -> Tensor:
    """``[..., V] -> [...]`` float32 entropy of softmax(logits) (chunked)."""
    targets = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return logprobs_and_entropy(logits, targets, chunk_size).entropy
