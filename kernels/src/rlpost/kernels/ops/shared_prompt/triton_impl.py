"""Triton kernels of shared-prompt attention (math in ``reference.py``).

Responses: one program per (response, head, block of ``BLOCK_M`` queries). It streams the
prompt's keys / values (shared by every response, stored once as ``[H, P, d]``) and then
its own response's keys up to the causal diagonal with an online softmax, and saves the
row log-sum-exp for the backward pass. The response-to-other-response blocks that a
packed dense mask would compute are never visited.

Backward (FlashAttention-2 style, recomputing the probabilities from the log-sum-exp):

* ``_bwd_dq``: per query block, ``dq = sum_k (p (dp - delta)) k * scale``;
* ``_bwd_dkv``: per key block, over the queries that see it: ``dv = p^T do``,
  ``dk = (p (dp - delta))^T q * scale``. A prompt key block is seen by every response:
  each response writes its own partial ``[N, H, P, d]`` and the caller sums over ``N``.

The prompt's own (causal) outputs are computed once by the caller with the standard
attention; only the ``N`` responses go through these kernels.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from rlpost.kernels import dot_precision


@triton.jit
def _fwd(
    q_ptr,
    kp_ptr,
    vp_ptr,
    kr_ptr,
    vr_ptr,
    o_ptr,
    lse_ptr,
    H,
    P,
    R,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    nh = tl.program_id(0)  # response * H + head
    h = nh % H
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, D)
    mask_m = rm < R
    q = tl.load(q_ptr + nh * R * D + rm[:, None] * D + rd[None, :], mask=mask_m[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for n0 in range(0, P, BLOCK_N):  # the shared prompt: every key visible
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < P
        k = tl.load(
            kp_ptr + h * P * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        v = tl.load(
            vp_ptr + h * P * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(mask_n[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    hi = tl.minimum(R, (tl.program_id(1) + 1) * BLOCK_M)  # blocks above the diagonal: none
    for n0 in range(0, hi, BLOCK_N):  # this response's own keys, causal
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < R
        k = tl.load(
            kr_ptr + nh * R * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        v = tl.load(
            vr_ptr + nh * R * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        ok = mask_n[None, :] & (rn[None, :] <= rm[:, None])
        s = tl.where(ok, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + nh * R * D + rm[:, None] * D + rd[None, :], out, mask=mask_m[:, None])
    tl.store(lse_ptr + nh * R + rm, m_i + tl.log(l_i), mask=mask_m)


@triton.jit
def _bwd_dq(
    q_ptr,
    kp_ptr,
    vp_ptr,
    kr_ptr,
    vr_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    H,
    P,
    R,
    scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    nh = tl.program_id(0)
    h = nh % H
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, D)
    mask_m = rm < R
    off = nh * R * D + rm[:, None] * D + rd[None, :]
    q = tl.load(q_ptr + off, mask=mask_m[:, None], other=0.0)
    do = tl.load(do_ptr + off, mask=mask_m[:, None], other=0.0)
    lse = tl.load(lse_ptr + nh * R + rm, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + nh * R + rm, mask=mask_m, other=0.0)
    dq = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for n0 in range(0, P, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < P
        k = tl.load(
            kp_ptr + h * P * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        v = tl.load(
            vp_ptr + h * P * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        p = tl.where(mask_n[None, :], tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * scale
    hi = tl.minimum(R, (tl.program_id(1) + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < R
        k = tl.load(
            kr_ptr + nh * R * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        v = tl.load(
            vr_ptr + nh * R * D + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        ok = mask_n[None, :] & (rn[None, :] <= rm[:, None])
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION) * scale
    tl.store(dq_ptr + off, dq, mask=mask_m[:, None])


@triton.jit
def _bwd_dkv(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    H,
    K,
    R,
    k_nh_stride,
    scale,
    CAUSAL: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One key block (of the prompt when not CAUSAL: ``K = P`` keys at ``k_ptr + h P D``;
    of the response when CAUSAL) against all queries of response ``n``; writes this
    response's partial ``dk`` / ``dv`` for the block at ``[nh, K, D]``."""
    nh = tl.program_id(0)
    h = nh % H
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    mask_n = rn < K
    k_base = nh * K * D if CAUSAL else h * k_nh_stride
    k = tl.load(k_ptr + k_base + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0)
    v = tl.load(v_ptr + k_base + rn[:, None] * D + rd[None, :], mask=mask_n[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    lo = 0
    if CAUSAL:  # query blocks wholly before this key block see none of it: skipped
        lo = (tl.program_id(1) * BLOCK_N // BLOCK_M) * BLOCK_M
    for m0 in range(lo, R, BLOCK_M):
        rm = m0 + tl.arange(0, BLOCK_M)
        mask_m = rm < R
        off = nh * R * D + rm[:, None] * D + rd[None, :]
        q = tl.load(q_ptr + off, mask=mask_m[:, None], other=0.0)
        do = tl.load(do_ptr + off, mask=mask_m[:, None], other=0.0)
        lse = tl.load(lse_ptr + nh * R + rm, mask=mask_m, other=0.0)
        delta = tl.load(delta_ptr + nh * R + rm, mask=mask_m, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [M, N]
        ok = mask_m[:, None] & mask_n[None, :]
        if CAUSAL:
            ok = ok & (rn[None, :] <= rm[:, None])
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION) * scale
    out = nh * K * D + rn[:, None] * D + rd[None, :]
    tl.store(dk_ptr + out, dk, mask=mask_n[:, None])
    tl.store(dv_ptr + out, dv, mask=mask_n[:, None])


def _blocks(device: torch.device) -> tuple[int, int]:
    return (64, 64) if device.type == "cuda" else (16, 16)


class SharedPromptResponsesTriton(torch.autograd.Function):
    """Response outputs ``[N, H, R, d]`` from the prompt's ``k_p, v_p [H, P, d]`` and the
    responses' ``q_r, k_r, v_r [N, H, R, d]`` (float32, bfloat16 or float16, one dtype;
    ``d`` a power of two >= 16). 16-bit inputs: the probabilities and ``ds`` are rounded to
    the input dtype for their matrix products, FlashAttention's choice; the softmax
    statistics and every accumulator are float32."""

    @staticmethod
    def forward(ctx, k_p, v_p, q_r, k_r, v_r, scale):
        N, H, R, D = q_r.shape
        P = k_p.shape[1]
        bm, bn = _blocks(q_r.device)
        args = [t.contiguous() for t in (q_r, k_p, v_p, k_r, v_r)]
        out = torch.empty_like(args[0])
        lse = torch.empty(N, H, R, device=q_r.device, dtype=torch.float32)
        prec = dot_precision(q_r.dtype)
        _fwd[(N * H, triton.cdiv(R, bm))](
            *args, out, lse, H, P, R, scale, D=D, BLOCK_M=bm, BLOCK_N=bn, PRECISION=prec
        )
        ctx.save_for_backward(*args, out, lse)
        ctx.scale, ctx.prec = scale, prec
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k_p, v_p, k_r, v_r, out, lse = ctx.saved_tensors
        N, H, R, D = q.shape
        P = k_p.shape[1]
        bm, bn = _blocks(q.device)
        do = d_out.contiguous().to(q.dtype)  # (the dots take operands of one dtype)
        delta = (do.float() * out.float()).sum(-1).contiguous()  # [N, H, R], float32
        dq = torch.empty_like(q)
        _bwd_dq[(N * H, triton.cdiv(R, bm))](
            q,
            k_p,
            v_p,
            k_r,
            v_r,
            do,
            lse,
            delta,
            dq,
            H,
            P,
            R,
            ctx.scale,
            D=D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            PRECISION=ctx.prec,
        )
        dk_p_parts = torch.empty(N, H, P, D, device=q.device, dtype=torch.float32)
        dv_p_parts = torch.empty_like(dk_p_parts)
        _bwd_dkv[(N * H, triton.cdiv(P, bn))](
            q,
            k_p,
            v_p,
            do,
            lse,
            delta,
            dk_p_parts,
            dv_p_parts,
            H,
            P,
            R,
            P * D,
            ctx.scale,
            CAUSAL=False,
            D=D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            PRECISION=ctx.prec,
        )
        dk_r, dv_r = torch.empty_like(k_r), torch.empty_like(v_r)
        _bwd_dkv[(N * H, triton.cdiv(R, bn))](
            q,
            k_r,
            v_r,
            do,
            lse,
            delta,
            dk_r,
            dv_r,
            H,
            R,
            R,
            0,
            ctx.scale,
            CAUSAL=True,
            D=D,
            BLOCK_M=bm,
            BLOCK_N=bn,
            PRECISION=ctx.prec,
        )
        dk_p, dv_p = dk_p_parts.sum(0).to(k_p.dtype), dv_p_parts.sum(0).to(v_p.dtype)
        return dk_p, dv_p, dq, dk_r, dv_r, None


def shared_prompt_attention_triton(
    q_p: Tensor,
    k_p: Tensor,
    v_p: Tensor,
    q_r: Tensor,
    k_r: Tensor,
    v_r: Tensor,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Same contract as the reference: the prompt's causal attention with the standard
    kernel, the responses through the shared-prompt kernels."""
    import torch.nn.functional as F

    scale = 1.0 / math.sqrt(q_p.shape[-1]) if scale is None else scale
    out_p = F.scaled_dot_product_attention(q_p, k_p, v_p, is_causal=True, scale=scale)
    out_r = SharedPromptResponsesTriton.apply(k_p, v_p, q_r, k_r, v_r, scale)
    return out_p, out_r
