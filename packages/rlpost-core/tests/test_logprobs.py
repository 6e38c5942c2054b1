import pytest
import torch
from torch.testing import assert_close

from rlpost.core import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits


def naive(logits, targets, tau=1.0):
    lp = (logits.float() / tau).log_softmax(-1)
    return lp.gather(-1, targets[..., None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_matches_naive_values_and_gradients(chunk, tau):
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 11) * 3).requires_grad_(True)
    targets = torch.randint(0, 11, (2, 5))
    w1, w2 = torch.randn(2, 5), torch.randn(2, 5)  # arbitrary upstream gradients
    out = logprobs_and_entropy(logits, targets, chunk_size=chunk, temperature=tau)
    (g,) = torch.autograd.grad((out.logp * w1).sum() + (out.entropy * w2).sum(), logits)
    ref_lp, ref_h = naive(logits, targets, tau)
    (g_ref,) = torch.autograd.grad((ref_lp * w1).sum() + (ref_h * w2).sum(), logits)
    assert_close(out.logp, ref_lp)
    assert_close(out.entropy, ref_h)
    assert_close(g, g_ref)


def test_gradcheck_float64():
    torch.manual_seed(0)
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (4,))
    # the function computes in float32, so compare float64 autograd vs ours at float32 tolerance
    out = logprobs_and_entropy(logits, targets, chunk_size=3)
    (g,) = torch.autograd.grad(out.logp.sum() + 2 * out.entropy.sum(), logits)
    lp, h = naive(logits.double(), targets)
    (g_ref,) = torch.autograd.grad(lp.sum() + 2 * h.sum(), logits)
    assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


def test_bfloat16_logits_keep_dtype_of_gradient():
    logits = torch.randn(3, 4, 50).bfloat16().requires_grad_(True)
    targets = torch.randint(0, 50, (3, 4))
    out = logprobs_and_entropy(logits, targets, chunk_size=5)
    assert out.logp.dtype == torch.float32
    out.logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    ref_lp, _ = naive(logits.detach(), targets)
    assert_close(out.logp, ref_lp)


def test_only_one_output_used_and_helpers():
    logits = torch.randn(7, 9, requires_grad=True)
    t = torch.randint(0, 9, (7,))
    entropy_from_logits(logits, chunk_size=2).sum().backward()
    _, h = naive(logits, t)
    (g_ref,) = torch.autograd.grad(h.sum(), logits)
    assert_close(logits.grad, g_ref)
    assert_close(logprobs_from_logits(logits, t), naive(logits, t)[0])


def test_uniform_entropy_is_log_v():
    assert entropy_from_logits(torch.zeros(2, 8)).tolist() == pytest.approx(
        [torch.log(torch.tensor(8.0)).item()] * 2
    )


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="targets shape"):
        logprobs_and_entropy(torch.randn(2, 3, 5), torch.zeros(2, dtype=torch.long))
