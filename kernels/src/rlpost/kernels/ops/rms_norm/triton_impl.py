"""Triton kernels of RMSNorm (math in ``reference.py``), one pass each way.

Forward: a program per row reads the row once and writes the normalised, weighted row and
its ``1 / rms`` (float32, kept for the backward). Backward: a program per ``ROWS`` rows
writes each row's input gradient, ``rstd (g - x_hat mean(g x_hat))`` with ``g = dy w``,
and one float32 partial of the weight's gradient, ``sum dy x_hat`` (``x_hat`` cast to the
input's dtype, as the forward multiplied it); the partials are summed by the caller."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

ROWS = 16  # rows a backward program takes: one weight-gradient partial per program


@triton.jit
def _forward(x_ptr, w_ptr, y_ptr, rstd_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    # the row rounded to the weight's dtype, then the product in float32 rounded once at the
    # store: torch's own product of two 16-bit tensors
    y = (x * rstd).to(w.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _backward(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, m, n, ROWS: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ROWS):
        row = pid * ROWS + i
        live = mask & (row < m)
        x = tl.load(x_ptr + row * n + cols, mask=live, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * n + cols, mask=live, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row, mask=row < m, other=0.0)
        xh = x * rstd
        g = dy * w.to(tl.float32)
        dx = (g - xh * (tl.sum(g * xh, axis=0) / n)) * rstd
        tl.store(dx_ptr + row * n + cols, dx.to(dx_ptr.dtype.element_ty), mask=live)
        dw += dy * xh.to(w.dtype).to(tl.float32)
    tl.store(dw_ptr + pid * n + cols, dw, mask=mask)


def rms_norm_forward_triton(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(y [M, N], rstd [M] float32)`` for contiguous ``x [M, N]``."""
    M, N = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    _forward[(M,)](x, weight, y, rstd, N, eps, BLOCK=triton.next_power_of_2(N))
    return y, rstd


def rms_norm_backward_triton(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor]:
    """``(dx [M, N], dweight [N])`` for contiguous ``dy``, ``x`` ``[M, N]``."""
    M, N = x.shape
    dx = torch.empty_like(x)
    programs = triton.cdiv(M, ROWS)
    parts = torch.empty(programs, N, dtype=torch.float32, device=x.device)
    _backward[(programs,)](
        dy, x, weight, rstd, dx, parts, M, N, ROWS=ROWS, BLOCK=triton.next_power_of_2(N)
    )
    return dx, parts.sum(0).to(weight.dtype)
