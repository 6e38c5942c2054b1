"""MXFP4 fake quantisation with the exact scale-bias / deadzone / grid-noise error
decomposition (catalog 000-13); see ``reference.py`` for the math.

``decompose_mxfp4`` and ``fake_quant`` dispatch to the Triton kernel on CUDA (when Triton
is installed) and to the torch reference elsewhere; ``backend`` forces one.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlpost.kernels import use_triton
from rlpost.kernels.ops.mxfp4.reference import (
    BLOCK,
    AdaptiveQuantNoise,
    MXFP4Parts,
    _blocks,
    _fallback,
    macro_factors,
    round_fp4,
)
from rlpost.kernels.ops.mxfp4.reference import decompose_mxfp4 as decompose_mxfp4_reference

Backend = Literal["auto", "triton", "reference"]


def decompose_mxfp4(
    x: Tensor,
    block: int = BLOCK,
    macro: int | None = None,
    outliers: int = 0,
    backend: Backend = "auto",
) -> MXFP4Parts:
    """MXFP4-quantised ``x`` and its error parts (``scale_bias + deadzone + grid = q - x``)."""
    if not use_triton(backend, x):
        return decompose_mxfp4_reference(x, block, macro, outliers)
    from rlpost.kernels.ops.mxfp4.triton_impl import decompose_mxfp4_triton

    xb = _blocks(x.float(), block)
    r = macro_factors(xb, macro)
    parts = decompose_mxfp4_triton(xb, r.reshape(-1), block)
    parts = _fallback(xb, parts, outliers)
    return MXFP4Parts(*(t.reshape(x.shape).to(x.dtype) for t in parts))


class _FakeQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, block, macro, outliers, backend):
        return decompose_mxfp4(x, block, macro, outliers, backend).q

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None


def fake_quant(
    x: Tensor,
    block: int = BLOCK,
    macro: int | None = None,
    outliers: int = 0,
    backend: Backend = "auto",
) -> Tensor:
    """MXFP4 fake quantisation with a straight-through gradient (identity backward)."""
    return _FakeQuantSTE.apply(x, block, macro, outliers, backend)


__all__ = [
    "AdaptiveQuantNoise",
    "MXFP4Parts",
    "decompose_mxfp4",
    "fake_quant",
    "macro_factors",
    "round_fp4",
]
