"""The gated activation (rlpost.kernels.ops.swiglu): the reference is transformers' MLP
activation, the kernels' backward formula equals autograd, the Triton kernels equal the
reference under Triton's interpreter, and ``fuse_mlps`` routes a model's MLPs without
changing it."""

from __future__ import annotations

import pytest
import torch

from rlpost.kernels.ops.swiglu import fuse_mlps, swiglu, swiglu_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_is_transformers_mlp_activation_bit_for_bit(dtype):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    torch.manual_seed(0)
    mlp = Qwen2MLP(Qwen2Config(hidden_size=32, intermediate_size=80)).to(dtype)
    x = torch.randn(3, 5, 32).to(dtype)
    ours = mlp.down_proj(swiglu_reference(mlp.gate_proj(x), mlp.up_proj(x)))
    assert torch.equal(ours, mlp(x))


def test_the_kernels_backward_formula_equals_autograd_in_float64():
    """``dgate = dh up sigmoid(g) (1 + g (1 - sigmoid(g)))``, ``dup = dh silu(g)``."""
    gen = torch.Generator().manual_seed(2)
    g = (4 * torch.randn(9, 33, generator=gen, dtype=torch.float64)).requires_grad_()
    u = torch.randn(9, 33, generator=gen, dtype=torch.float64, requires_grad=True)
    dh = torch.randn(9, 33, generator=gen, dtype=torch.float64)
    swiglu_reference(g, u).backward(dh)
    with torch.no_grad():
        sig = torch.sigmoid(g)
        dg, du = dh * u * sig * (1 + g * (1 - sig)), dh * g * sig
    torch.testing.assert_close(dg, g.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(du, u.grad, rtol=1e-12, atol=1e-12)


def test_triton_kernels_match_the_reference_under_the_interpreter(interpreted):
    """Sizes not a multiple of the kernel's block, three dimensions, bfloat16."""
    for case, errs in interpreted("_swiglu_triton_check.py").items():
        # float32 to rounding (|values| < 30); bfloat16 to one unit in the last place
        bound = 1e-5 if "float32" in case else 0.125
        assert max(errs.values()) <= bound, (case, errs)


def test_fused_mlps_leave_a_model_unchanged_and_refuse_a_bad_backend(routed_unchanged):
    assert routed_unchanged(fuse_mlps) == 2
    with pytest.raises(ValueError, match="backend must be"):
        swiglu(torch.ones(2, 9), torch.ones(2, 9), backend="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_on_cuda(dtype):
    gen = torch.Generator().manual_seed(0)
    g = (4 * torch.randn(300, 3072, generator=gen)).to(dtype).cuda()
    u = torch.randn(300, 3072, generator=gen).to(dtype).cuda()
    dh = torch.randn(300, 3072, generator=gen).to(dtype).cuda()
    res = []
    for backend in ("triton", "reference"):
        gi, ui = g.clone().requires_grad_(), u.clone().requires_grad_()
        swiglu(gi, ui, backend=backend).backward(dh)
        res.append((swiglu(g, u, backend=backend).float(), gi.grad.float(), ui.grad.float()))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 0.3}
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, **tol)
