"""Torch reference of the fused linear log-prob / entropy op, chunked over the vocabulary.

For hidden states ``h [N, D]``, the LM-head weight ``W [V, D]``, sampled tokens ``y [N]``
and a temperature ``T``, with logits ``z = h W^T / T``:

    logp_n    = z_{n, y_n} - logZ_n,          logZ_n = log sum_j exp z_{n j}
    entropy_n = logZ_n - sum_j p_{n j} z_{n j},   p = softmax(z)

Forward streams the vocabulary in chunks of ``chunk`` columns and keeps, per token, the
running max ``m``, ``s = sum exp(z - m)`` and ``t = sum exp(z - m) z`` (online softmax), so
only a ``[N, chunk]`` float32 block of logits exists at a time. Backward recomputes each
block and uses

    d logp_n / d z_{n j}    = [j = y_n] - p_{n j}
    d entropy_n / d z_{n j} = -p_{n j} (log p_{n j} + entropy_n)

then ``dh = dz W / T`` and ``dW = dz^T h / T`` block by block. The saved state is
``h``, ``W``, ``y`` and two floats per token (``logZ``, ``entropy``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _block(h: Tensor, w: Tensor, lo: int, hi: int, temperature: float) -> Tensor:
    return (h @ w[lo:hi].T).float() / temperature


class _LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, y: Tensor, temperature: float, chunk: int):
        n, v = h.shape[0], w.shape[0]
        m = torch.full((n,), -torch.inf, device=h.device)
        s = torch.zeros(n, device=h.device)
        t = torch.zeros(n, device=h.device)
        z_y = torch.zeros(n, device=h.device)
        rows = torch.arange(n, device=h.device)
        for lo in range(0, v, chunk):
            hi = min(lo + chunk, v)
            z = _block(h, w, lo, hi, temperature)
            m_new = torch.maximum(m, z.max(1).values)
            scale = torch.exp(m - m_new)
            e = torch.exp(z - m_new[:, None])
            s = s * scale + e.sum(1)
            t = t * scale + (e * z).sum(1)
            m = m_new
            inside = (y >= lo) & (y < hi)
            z_y = torch.where(inside, z[rows, (y - lo).clamp(0, hi - lo - 1)], z_y)
        log_z = m + torch.log(s)
        entropy = log_z - t / s
        ctx.save_for_backward(h, w, y, log_z, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        return z_y - log_z, entropy

    @staticmethod
    def backward(ctx, g_logp: Tensor | None, g_ent: Tensor | None):
        h, w, y, log_z, entropy = ctx.saved_tensors
        temp, chunk = ctx.temperature, ctx.chunk
        n, v = h.shape[0], w.shape[0]
        g_logp = torch.zeros(n, device=h.device) if g_logp is None else g_logp.float()
        g_ent = torch.zeros(n, device=h.device) if g_ent is None else g_ent.float()
        dh = torch.zeros(h.shape, device=h.device, dtype=torch.float32)
        dw = torch.zeros(w.shape, device=w.device, dtype=torch.float32)
        rows = torch.arange(n, device=h.device)
        for lo in range(0, v, chunk):
            hi = min(lo + chunk, v)
            z = _block(h, w, lo, hi, temp)
            logp = z - log_z[:, None]
            p = logp.exp()
            dz = -g_logp[:, None] * p - g_ent[:, None] * p * (logp + entropy[:, None])
            inside = (y >= lo) & (y < hi)
            dz[rows[inside], y[inside] - lo] += g_logp[inside]
            dz = dz / temp
            dh += dz @ w[lo:hi].float()
            dw[lo:hi] += dz.T @ h.float()
        return dh.to(h.dtype), dw.to(w.dtype), None, None, None


def linear_logprob_entropy_reference(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float = 1.0, chunk: int = 4096
) -> tuple[Tensor, Tensor]:
    """``(logp [N], entropy [N])`` in float32 (see the module docstring)."""
    return _LinearLogprobEntropy.apply(hidden, weight, tokens, float(temperature), int(chunk))


def linear_logprob_entropy_naive(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The obvious version: materialise ``[N, V]`` float32 logits and ``log_softmax``."""
    logp_all = ((hidden @ weight.T).float() / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
