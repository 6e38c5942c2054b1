"""The MLP's gated activation, ``silu(gate) * up``, in one fused pass forward and one
backward (issue 45's "fused activation"), equal to transformers' own (``reference.py``).

``swiglu`` dispatches to the Triton kernels on CUDA (when Triton is installed, gate and up
of one dtype and shape) and to the torch reference elsewhere; ``backend`` forces one.
:func:`fuse_mlps` routes a model's own MLPs through it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlpost.kernels import use_triton
from rlpost.kernels.ops.swiglu.reference import swiglu_reference

Backend = Literal["auto", "triton", "reference"]
#: transformers' MLP classes computed as ``down(silu(gate(x)) * up(x))``
PLAIN = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        from rlpost.kernels.ops.swiglu.triton_impl import swiglu_forward_triton

        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        return swiglu_forward_triton(gate, up)

    @staticmethod
    def backward(ctx, dh: Tensor):
        from rlpost.kernels.ops.swiglu.triton_impl import swiglu_backward_triton

        gate, up = ctx.saved_tensors
        return swiglu_backward_triton(dh.contiguous(), gate, up)


def swiglu(gate: Tensor, up: Tensor, backend: Backend = "auto") -> Tensor:
    """``silu(gate) * up``, differentiable in both."""
    if use_triton(backend, gate, fits=gate.dtype == up.dtype and gate.shape == up.shape):
        return _SwiGLU.apply(gate, up)
    return swiglu_reference(gate, up)


def fuse_mlps(model: torch.nn.Module, backend: Backend = "auto") -> int:
    """Route ``model``'s MLPs of the plain kind (``PLAIN``, SiLU-gated) through
    :func:`swiglu`, their projections (LoRA-wrapped or not) called as before; the number of
    MLPs routed."""
    count = 0
    for module in model.modules():
        act = type(getattr(module, "act_fn", None)).__name__
        if type(module).__name__ in PLAIN and act in ("SiLUActivation", "SiLU"):

            def forward(x: Tensor, m=module) -> Tensor:
                return m.down_proj(swiglu(m.gate_proj(x), m.up_proj(x), backend))

            module.forward = forward
            count += 1
    return count


__all__ = ["PLAIN", "fuse_mlps", "swiglu", "swiglu_reference"]
