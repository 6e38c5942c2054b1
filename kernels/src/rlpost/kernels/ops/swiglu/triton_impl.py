"""Triton kernels of the gated activation (math in ``reference.py``), one pass each way
over flat contiguous tensors. Forward: ``h = silu(g) * u``, ``silu(g)`` rounded to the
dtype before the product (as torch's two kernels round it). Backward: ``du = dh silu(g)``
and ``dg = dh u sigmoid(g) (1 + g (1 - sigmoid(g)))``, in float32, rounded at the store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 1024


@triton.jit
def _forward(g_ptr, u_ptr, h_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(h_ptr + offs, (s * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-gf))
    s = (gf * sig).to(g.dtype).to(tl.float32)
    tl.store(du_ptr + offs, (dh * s).to(du_ptr.dtype.element_ty), mask=mask)
    dg = dh * u * sig * (1.0 + gf * (1.0 - sig))
    tl.store(dg_ptr + offs, dg.to(dg_ptr.dtype.element_ty), mask=mask)


def swiglu_forward_triton(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` for contiguous tensors of one shape."""
    h = torch.empty_like(gate)
    n = gate.numel()
    _forward[(triton.cdiv(n, BLOCK),)](gate, up, h, n, BLOCK=BLOCK)
    return h


def swiglu_backward_triton(dh: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    """``(dgate, dup)`` for contiguous tensors of one shape."""
    dg, du = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    _backward[(triton.cdiv(n, BLOCK),)](dh, gate, up, dg, du, n, BLOCK=BLOCK)
    return dg, du
