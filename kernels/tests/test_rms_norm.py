"""RMSNorm (rlpost.kernels.ops.rms_norm): the reference is transformers' own norm, the
kernels' backward formula equals autograd, the Triton kernels equal the reference under
Triton's interpreter, and ``fuse_rms_norms`` routes a model's norms without changing it."""

from __future__ import annotations

import pytest
import torch

from rlpost.kernels.ops.rms_norm import fuse_rms_norms, rms_norm, rms_norm_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_is_transformers_norm_bit_for_bit(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, 96, generator=g) * 4).to(dtype)
    for cls in (LlamaRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm):
        norm = cls(96, eps=1e-5).to(dtype)
        norm.weight.data = (1 + torch.randn(96, generator=g) / 4).to(dtype)
        assert torch.equal(rms_norm_reference(x, norm.weight, 1e-5), norm(x)), cls.__name__


def test_the_kernels_backward_formula_equals_autograd_in_float64():
    """What the backward kernel computes, written in torch: ``dx = rstd (g - x_hat
    mean(g x_hat))`` with ``g = dy w``, ``dw = sum dy x_hat``; against autograd through the
    norm's formula, float64 (the reference itself takes its statistics in float32)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, 40, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(11, 40, generator=g, dtype=torch.float64)
    (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))).backward(dy)
    with torch.no_grad():
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        xh, gw = x * rstd, dy * w
        dx = rstd * (gw - xh * (gw * xh).mean(-1, keepdim=True))
        dw = (dy * xh).sum(0)
    torch.testing.assert_close(dx, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, w.grad, rtol=1e-12, atol=1e-12)


def test_triton_kernels_match_the_reference_under_the_interpreter(interpreted):
    """Rows not a multiple of a backward program's, widths not a power of two, bfloat16."""
    for case, errs in interpreted("_rms_norm_triton_check.py").items():
        # float32 to rounding; bfloat16 to one or two units in the last place at |y| < 16
        bound = 1e-5 if "float32" in case else {"y": 0.0625, "dx": 0.02, "dw": 0.125}
        for name, err in errs.items():
            assert err <= (bound if isinstance(bound, float) else bound[name]), (case, errs)


def test_fused_norms_leave_a_model_unchanged_and_refuse_a_bad_backend(routed_unchanged):
    assert routed_unchanged(fuse_rms_norms) == 2 * 2 + 1  # two a layer and the final one
    with pytest.raises(ValueError, match="backend must be"):
        rms_norm(torch.ones(2, 9), torch.ones(9), 1e-6, backend="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_on_cuda(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(300, 1024, generator=g) * 3).to(dtype).cuda()
    w = (1 + torch.randn(1024, generator=g) / 4).to(dtype).cuda()
    dy = torch.randn(300, 1024, generator=g).to(dtype).cuda()
    res = []
    for backend in ("triton", "reference"):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = rms_norm(xi, wi, 1e-6, backend=backend)
        y.backward(dy)
        res.append((y.float(), xi.grad.float(), wi.grad.float()))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 0.3}
    for a, b in zip(*res, strict=True):
        torch.testing.assert_close(a, b, **tol)
