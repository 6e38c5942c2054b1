"""Triton kernel of MXFP4 fake quantisation with the error decomposition (math in
``reference.py``). One program quantises ``ROWS`` blocks of 32: the block maximum, the
power-of-two and ideal scales, FP4 rounding (nearest, ties to even, saturating) under
both, and the three error parts, in one pass over the data. The macro-block factor ``r``
comes in per block (ones without macro-block scaling); outlier fallback is applied by the
caller on the kernel's outputs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _round_fp4(v):
    a = tl.minimum(tl.abs(v), 6.0)
    g = tl.where(a > 0.25, 0.5, 0.0)
    g = tl.where(a >= 0.75, 1.0, g)
    g = tl.where(a > 1.25, 1.5, g)
    g = tl.where(a >= 1.75, 2.0, g)
    g = tl.where(a > 2.5, 3.0, g)
    g = tl.where(a >= 3.5, 4.0, g)
    g = tl.where(a > 5.0, 6.0, g)
    return tl.where(v < 0, -g, g)


@triton.jit
def _mxfp4_kernel(
    x_ptr, r_ptr, q_ptr, sb_ptr, dz_ptr, gr_ptr, n_blocks, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask_r = rows < n_blocks
    offs = rows[:, None] * BLOCK + cols[None, :]
    mask = mask_r[:, None]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows, mask=mask_r, other=1.0).to(tl.float32)
    xr = x / r[:, None]
    amax_r = tl.max(tl.abs(xr), axis=1)
    amax_r = tl.where(amax_r > 0, amax_r, 1.0)
    s = tl.exp2(tl.floor(tl.log2(amax_r)) - 2.0)
    amax = tl.max(tl.abs(x), axis=1)
    s_ideal = tl.where(amax > 0, amax, 1.0) / 6.0
    q = (r * s)[:, None] * _round_fp4(xr / s[:, None])
    ideal = s_ideal[:, None] * _round_fp4(x / s_ideal[:, None])
    dead = ideal == 0.0
    tl.store(q_ptr + offs, q, mask=mask)
    tl.store(sb_ptr + offs, q - ideal, mask=mask)
    tl.store(dz_ptr + offs, tl.where(dead, -x, 0.0), mask=mask)
    tl.store(gr_ptr + offs, tl.where(dead, 0.0, ideal - x), mask=mask)


def decompose_mxfp4_triton(x: Tensor, r: Tensor, block: int = 32) -> tuple[Tensor, ...]:
    """``(q, scale_bias, deadzone, grid)`` of ``x`` (float32, last dim a multiple of
    ``block``) with per-block macro factors ``r`` (``[x.numel() // block]``)."""
    xf = x.contiguous().float()
    n_blocks = xf.numel() // block
    outs = [torch.empty_like(xf) for _ in range(4)]
    rows = 16
    _mxfp4_kernel[(triton.cdiv(n_blocks, rows),)](
        xf, r.contiguous().float(), *outs, n_blocks, ROWS=rows, BLOCK=block
    )
    return tuple(o.view(x.shape) for o in outs)
