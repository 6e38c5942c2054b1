"""RMSNorm in one fused pass forward and one backward (issue 45's "fused norm"): the
norm of the Llama / Mistral / Qwen2 / Qwen3 decoders, equal to transformers' own
(``reference.py``).

``rms_norm`` dispatches to the Triton kernels on CUDA (when Triton is installed, the
weight in the input's dtype) and to the torch reference elsewhere; ``backend`` forces one.
:func:`fuse_rms_norms` routes a model's own RMSNorm modules through it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlpost.kernels import use_triton
from rlpost.kernels.ops.rms_norm.reference import rms_norm_reference

Backend = Literal["auto", "triton", "reference"]
#: transformers' RMSNorm classes computed as ``rms_norm_reference`` does
PLAIN = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        from rlpost.kernels.ops.rms_norm.triton_impl import rms_norm_forward_triton

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y, rstd = rms_norm_forward_triton(rows, weight.contiguous(), eps)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor):
        from rlpost.kernels.ops.rms_norm.triton_impl import rms_norm_backward_triton

        rows, weight, rstd = ctx.saved_tensors
        grads = dy.reshape(rows.shape).contiguous()
        dx, dw = rms_norm_backward_triton(grads, rows, weight.contiguous(), rstd)
        return dx.view(ctx.shape), dw, None


def rms_norm(x: Tensor, weight: Tensor, eps: float, backend: Backend = "auto") -> Tensor:
    """RMSNorm over the last dimension (``reference.py``), differentiable in ``x`` and
    ``weight``."""
    if use_triton(backend, x, fits=weight.dtype == x.dtype):
        return _RMSNorm.apply(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def fuse_rms_norms(model: torch.nn.Module, backend: Backend = "auto") -> int:
    """Route ``model``'s RMSNorm modules of the plain kind (``PLAIN``) through
    :func:`rms_norm`, forward and backward (so activation checkpointing recomputes the
    same); the number of modules routed."""
    count = 0
    for module in model.modules():
        if type(module).__name__ in PLAIN and hasattr(module, "variance_epsilon"):

            def forward(x: Tensor, m=module) -> Tensor:
                return rms_norm(x, m.weight, m.variance_epsilon, backend)

            module.forward = forward
            count += 1
    return count


__all__ = ["PLAIN", "fuse_rms_norms", "rms_norm", "rms_norm_reference"]
