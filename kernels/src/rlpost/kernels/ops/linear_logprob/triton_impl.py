"""Triton kernels of the fused linear log-prob / entropy op (see ``reference.py`` for the
math). Imported only when used: on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (tests).

* ``_fwd``: one program per block of tokens streams the vocabulary in ``BLOCK_V`` tiles
  (each tile's logits from a ``BLOCK_D``-tiled ``tl.dot``), keeping the online-softmax
  running max, sum and logit-weighted sum; writes ``logp``, ``entropy`` and ``logZ``.
* ``_bwd_dh``: per token block, recomputes each logit tile, forms ``dz`` and accumulates
  ``dh += dz W`` into rows only this program owns.
* ``_bwd_dw``: per vocabulary block, loops over token blocks, recomputes ``dz`` and
  accumulates ``dW += dz^T h`` into rows only this program owns.
No ``[N, V]`` tensor is ever written; the logits live in registers one tile at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from rlpost.kernels import dot_precision


@triton.jit
def _logits_tile(
    h_ptr,
    w_ptr,
    rn,
    rv,
    mask_n,
    mask_v,
    D,
    stride_h,
    stride_w,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        rd = d0 + tl.arange(0, BLOCK_D)
        mask_d = rd < D
        hb = tl.load(
            h_ptr + rn[:, None] * stride_h + rd[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        wb = tl.load(
            w_ptr + rv[:, None] * stride_w + rd[None, :],
            mask=mask_v[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc += tl.dot(hb, tl.trans(wb), input_precision=PRECISION)
    return acc * inv_t


@triton.jit
def _fwd(
    h_ptr,
    w_ptr,
    y_ptr,
    logp_ptr,
    ent_ptr,
    logz_ptr,
    N,
    V,
    D,
    stride_h,
    stride_w,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    y = tl.load(y_ptr + rn, mask=mask_n, other=0)
    m = tl.full((BLOCK_N,), -float("inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    t = tl.zeros((BLOCK_N,), dtype=tl.float32)
    zy = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        rv = v0 + tl.arange(0, BLOCK_V)
        mask_v = rv < V
        z = _logits_tile(
            h_ptr,
            w_ptr,
            rn,
            rv,
            mask_n,
            mask_v,
            D,
            stride_h,
            stride_w,
            inv_t,
            BLOCK_N,
            BLOCK_V,
            BLOCK_D,
            PRECISION,
        )
        z_ok = tl.where(mask_v[None, :], z, 0.0)
        z = tl.where(mask_v[None, :], z, -float("inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        scale = tl.exp(m - m_new)
        e = tl.exp(z - m_new[:, None])
        s = s * scale + tl.sum(e, axis=1)
        t = t * scale + tl.sum(e * z_ok, axis=1)
        m = m_new
        zy += tl.sum(tl.where(rv[None, :] == y[:, None], z_ok, 0.0), axis=1)
    log_z = m + tl.log(s)
    tl.store(logp_ptr + rn, zy - log_z, mask=mask_n)
    tl.store(ent_ptr + rn, log_z - t / s, mask=mask_n)
    tl.store(logz_ptr + rn, log_z, mask=mask_n)


@triton.jit
def _dz_tile(z, rv, mask_v, y, log_z, ent, g_logp, g_ent, inv_t):
    logp = z - log_z[:, None]
    p = tl.where(mask_v[None, :], tl.exp(logp), 0.0)
    hit = tl.where(rv[None, :] == y[:, None], 1.0, 0.0)
    dz = g_logp[:, None] * (hit - p) - g_ent[:, None] * p * (logp + ent[:, None])
    return tl.where(mask_v[None, :], dz, 0.0) * inv_t


@triton.jit
def _dz_block(
    h_ptr,
    w_ptr,
    y_ptr,
    logz_ptr,
    ent_ptr,
    glogp_ptr,
    gent_ptr,
    rn,
    rv,
    mask_n,
    mask_v,
    D,
    stride_h,
    stride_w,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``d loss / d z`` of one (token block, vocabulary tile), logits recomputed; rows
    outside the tokens are zero."""
    y = tl.load(y_ptr + rn, mask=mask_n, other=0)
    log_z = tl.load(logz_ptr + rn, mask=mask_n, other=0.0)
    ent = tl.load(ent_ptr + rn, mask=mask_n, other=0.0)
    g_logp = tl.load(glogp_ptr + rn, mask=mask_n, other=0.0)
    g_ent = tl.load(gent_ptr + rn, mask=mask_n, other=0.0)
    z = _logits_tile(
        h_ptr, w_ptr, rn, rv, mask_n, mask_v, D, stride_h, stride_w, inv_t,
        BLOCK_N, BLOCK_V, BLOCK_D, PRECISION,
    )  # fmt: skip
    dz = _dz_tile(z, rv, mask_v, y, log_z, ent, g_logp, g_ent, inv_t)
    return tl.where(mask_n[:, None], dz, 0.0)


@triton.jit
def _bwd_dh(
    h_ptr,
    w_ptr,
    y_ptr,
    logz_ptr,
    ent_ptr,
    glogp_ptr,
    gent_ptr,
    dh_ptr,
    N,
    V,
    D,
    stride_h,
    stride_w,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    for v0 in range(0, V, BLOCK_V):
        rv = v0 + tl.arange(0, BLOCK_V)
        mask_v = rv < V
        dz = _dz_block(
            h_ptr, w_ptr, y_ptr, logz_ptr, ent_ptr, glogp_ptr, gent_ptr, rn, rv, mask_n,
            mask_v, D, stride_h, stride_w, inv_t, BLOCK_N, BLOCK_V, BLOCK_D, PRECISION,
        )  # fmt: skip
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            mask_d = rd < D
            wb = tl.load(
                w_ptr + rv[:, None] * stride_w + rd[None, :],
                mask=mask_v[:, None] & mask_d[None, :],
                other=0.0,
            )
            ptr = dh_ptr + rn[:, None] * D + rd[None, :]
            mask = mask_n[:, None] & mask_d[None, :]
            acc = tl.load(ptr, mask=mask, other=0.0)
            tl.store(ptr, acc + tl.dot(dz, wb.to(tl.float32), input_precision=PRECISION), mask=mask)


@triton.jit
def _bwd_dw(
    h_ptr,
    w_ptr,
    y_ptr,
    logz_ptr,
    ent_ptr,
    glogp_ptr,
    gent_ptr,
    dw_ptr,
    N,
    V,
    D,
    stride_h,
    stride_w,
    inv_t,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rv = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = rv < V
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < N
        dz = _dz_block(
            h_ptr, w_ptr, y_ptr, logz_ptr, ent_ptr, glogp_ptr, gent_ptr, rn, rv, mask_n,
            mask_v, D, stride_h, stride_w, inv_t, BLOCK_N, BLOCK_V, BLOCK_D, PRECISION,
        )  # fmt: skip
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            mask_d = rd < D
            hb = tl.load(
                h_ptr + rn[:, None] * stride_h + rd[None, :],
                mask=mask_n[:, None] & mask_d[None, :],
                other=0.0,
            )
            ptr = dw_ptr + rv[:, None] * D + rd[None, :]
            mask = mask_v[:, None] & mask_d[None, :]
            acc = tl.load(ptr, mask=mask, other=0.0)
            tl.store(
                ptr,
                acc + tl.dot(tl.trans(dz), hb.to(tl.float32), input_precision=PRECISION),
                mask=mask,
            )


#: tile sizes (tokens, vocabulary, hidden); tl.dot needs each >= 16
BLOCKS = {"cuda": (64, 128, 64), "cpu": (16, 32, 16)}
#: launch options (``num_warps``, ``num_stages``; Triton's defaults where absent).
#: ``tools/gpu_check.py``'s ``tiles`` part times other choices of both tables.
LAUNCH: dict[str, dict[str, int]] = {"cuda": {}, "cpu": {}}


def _config(t: Tensor) -> tuple[tuple[int, int, int], dict[str, int]]:
    kind = "cuda" if t.is_cuda else "cpu"
    return BLOCKS[kind], LAUNCH[kind]


class LinearLogprobEntropyTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, y: Tensor, temperature: float):
        h, w, y = h.contiguous(), w.contiguous(), y.contiguous()
        n, d = h.shape
        v = w.shape[0]
        (bn, bv, bd), launch = _config(h)
        logp = torch.empty(n, device=h.device, dtype=torch.float32)
        ent, log_z = torch.empty_like(logp), torch.empty_like(logp)
        inv_t = 1.0 / temperature
        _fwd[(triton.cdiv(n, bn),)](
            h,
            w,
            y,
            logp,
            ent,
            log_z,
            n,
            v,
            d,
            h.stride(0),
            w.stride(0),
            inv_t,
            BLOCK_N=bn,
            BLOCK_V=bv,
            BLOCK_D=bd,
            PRECISION=dot_precision(h.dtype),
            **launch,
        )
        ctx.save_for_backward(h, w, y, log_z, ent)
        ctx.inv_t = inv_t
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: Tensor | None, g_ent: Tensor | None):
        h, w, y, log_z, ent = ctx.saved_tensors
        n, d = h.shape
        v = w.shape[0]
        (bn, bv, bd), launch = _config(h)
        zero = torch.zeros(n, device=h.device, dtype=torch.float32)
        g_logp = zero if g_logp is None else g_logp.float().contiguous()
        g_ent = zero if g_ent is None else g_ent.float().contiguous()
        dh = torch.zeros(n, d, device=h.device, dtype=torch.float32)
        dw = torch.zeros(v, d, device=w.device, dtype=torch.float32)
        args = (h, w, y, log_z, ent, g_logp, g_ent)
        common = (n, v, d, h.stride(0), w.stride(0), ctx.inv_t)
        kw = dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_D=bd, PRECISION=dot_precision(h.dtype), **launch)
        _bwd_dh[(triton.cdiv(n, bn),)](*args, dh, *common, **kw)
        _bwd_dw[(triton.cdiv(v, bv),)](*args, dw, *common, **kw)
        return dh.to(h.dtype), dw.to(w.dtype), None, None
