"""Fused linear log-prob / entropy: the chunked reference and the Triton kernels against
the naive [N, V] log_softmax, outputs and both gradients."""

import pytest
import torch

from rlpost.kernels.ops.linear_logprob import (
    linear_logprob_entropy,
    linear_logprob_entropy_naive,
    linear_logprob_entropy_reference,
)


def _case(n=45, v=203, d=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    y = torch.randint(v, (n,), generator=g)
    return h, w, y


def _grads(fn, h, w, y, a, b):
    lp, ent = fn(h, w, y)
    dh, dw = torch.autograd.grad((a * lp).sum() + (b * ent).sum(), (h, w))
    return lp, ent, dh, dw


@pytest.mark.parametrize("chunk", [7, 64, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_reference_matches_naive_values_and_gradients(chunk, temperature):
    h, w, y = _case()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(45, generator=g), torch.randn(45, generator=g)
    ref = _grads(lambda *x: linear_logprob_entropy_reference(*x, temperature, chunk), h, w, y, a, b)
    naive = _grads(lambda *x: linear_logprob_entropy_naive(*x, temperature), h, w, y, a, b)
    for got, want in zip(ref, naive, strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_entropy_and_logprob_hand_worked():
    # two tokens, vocabulary 3, identity-like head: logits = h
    h = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    w = torch.eye(3)
    lp, ent = linear_logprob_entropy(h, w, torch.tensor([1, 0]))
    torch.testing.assert_close(lp[0], torch.log(torch.tensor(1 / 3)))
    torch.testing.assert_close(ent[0], torch.log(torch.tensor(3.0)))
    p = torch.softmax(torch.tensor([2.0, 0.0, 0.0]), 0)
    torch.testing.assert_close(lp[1], p[0].log())
    torch.testing.assert_close(ent[1], -(p * p.log()).sum())


def test_only_one_gradient_requested_and_bfloat16():
    h, w, y = _case(dtype=torch.bfloat16)
    lp, _ = linear_logprob_entropy(h, w, y, chunk=50)
    lp.sum().backward()  # entropy's gradient is None
    lp_n, _ = linear_logprob_entropy_naive(h.detach().requires_grad_(), w, y)
    torch.testing.assert_close(lp, lp_n, atol=1e-3, rtol=1e-3)
    assert h.grad.dtype == torch.bfloat16 and torch.isfinite(h.grad.float()).all()


def test_bad_input_is_named():
    h, w, y = _case()
    with pytest.raises(ValueError, match="tokens"):
        linear_logprob_entropy(h, w, y[:3])
    with pytest.raises(ValueError, match="weight"):
        linear_logprob_entropy(h, w[:, :5], y)
    with pytest.raises(ValueError, match="temperature"):
        linear_logprob_entropy(h, w, y, temperature=0)


def test_reference_peak_memory_is_one_chunk_not_the_vocabulary():
    """The saved state is h, W, y and two floats per token: no [N, V] tensor survives."""
    h, w, y = _case(n=64, v=5000, d=16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel()) or t, lambda t: t
    ):
        linear_logprob_entropy_reference(h, w, y, chunk=256)
    assert max(saved) <= 5000 * 16  # W itself; the naive op saves 64 x 5000 logits twice
    assert sum(saved) < 64 * 5000


def test_triton_kernels_match_naive_under_the_interpreter(interpreted):
    for case, errs in interpreted("_linear_logprob_triton_check.py").items():
        assert max(errs) < 1e-4, (case, errs)  # logp, entropy, dh, dW


def _rel_err(x, truth):
    return float((x.double() - truth).abs().max() / truth.abs().max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_on_cuda_float32_is_ieee():
    """float32 inputs: IEEE products (Triton's TF32 default would miss these bounds)."""
    h, w, y = (t.cuda() for t in _case(n=300, v=2000, d=256))
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    a = torch.randn(300, device="cuda")
    tri = _grads(lambda *x: linear_logprob_entropy(*x, backend="triton"), h, w, y, a, a)
    ref = _grads(lambda *x: linear_logprob_entropy(*x, backend="reference"), h, w, y, a, a)
    for got, want in zip(tri, ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_on_cuda_bfloat16():
    """bfloat16 inputs: log-probs, entropies and both gradients as close to the float64
    truth (the same bf16-valued inputs) as the torch reference's, which rounds the logits
    to bfloat16 where the kernel keeps float32 accumulators."""
    h, w, y = (t.cuda() for t in _case(n=300, v=2000, d=256, dtype=torch.bfloat16))
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    a = torch.randn(300, device="cuda")
    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    truth = _grads(linear_logprob_entropy_naive, hd, wd, y, a.double(), a.double())
    tri = _grads(lambda *x: linear_logprob_entropy(*x, backend="triton"), h, w, y, a, a)
    ref = _grads(lambda *x: linear_logprob_entropy(*x, backend="reference"), h, w, y, a, a)
    errs = [(_rel_err(x, t), _rel_err(r, t)) for x, r, t in zip(tri, ref, truth, strict=True)]
    assert all(e_tri <= max(2 * e_ref, 8e-3) for e_tri, e_ref in errs), errs
