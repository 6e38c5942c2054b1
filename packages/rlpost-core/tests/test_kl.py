import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import KL_ESTIMATORS, KLInput

# log pi - log pi_ref per token: lr = 0.5, -1.0, 0.0
LOGP = [[-1.0, -3.0, -2.0]]
REF = [[-1.5, -2.0, -2.0]]


def run(name, **params):
    logp = torch.tensor(LOGP, requires_grad=True)
    out = KL_ESTIMATORS.build(name, **params)(KLInput(logp, torch.tensor(REF)))
    out.kl.sum().backward()
    return out.kl.detach(), logp.grad


def test_k1_value_and_gradient():
    kl, g = run("k1")
    assert_close(kl, torch.tensor([[0.5, -1.0, 0.0]]))
    assert_close(g, torch.ones(1, 3))  # d lr / d log pi = 1


def test_k2_value_and_gradient():
    kl, g = run("k2")
    assert_close(kl, torch.tensor([[0.125, 0.5, 0.0]]))  # lr^2 / 2
    assert_close(g, torch.tensor([[0.5, -1.0, 0.0]]))  # lr


def test_k3_value_and_gradient():
    kl, g = run("k3")
    # k3 = e^-lr - 1 + lr: e^-0.5 - 0.5 = 0.1065; e^1 - 2 = 0.7183; 0
    assert_close(kl, torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]]))
    # grad = 1 - e^-lr
    assert_close(g, torch.tensor([[1 - math.exp(-0.5), 1 - math.e, 0.0]]))


@pytest.mark.parametrize("name", ["k1", "k3"])
def test_straight_through_keeps_value_uses_k2_gradient(name):
    kl, g = run(name, straight_through=True)
    kl_plain, _ = run(name)
    assert_close(kl, kl_plain)
    assert_close(g, torch.tensor([[0.5, -1.0, 0.0]]))


def exact_gradients(logits, ref_logits):
    """Analytic gradients w.r.t. logits of reverse KL(pi||ref) and forward KL(ref||pi)."""
    lg = logits.clone().requires_grad_(True)
    pi, logpi = lg.softmax(-1), lg.log_softmax(-1)
    logref = ref_logits.log_softmax(-1)
    rev = (pi * (logpi - logref)).sum()
    fwd = (logref.exp() * (logref - logpi)).sum()
    return torch.autograd.grad(rev, lg, retain_graph=True)[0], torch.autograd.grad(fwd, lg)[0]


@pytest.mark.parametrize(("name", "target"), [("k2", "reverse"), ("k3", "forward"), ("k1", "zero")])
def test_expected_estimator_gradient_over_exact_expectation(name, target):
    """E_{y~pi}[grad k(y)] computed exactly over a 5-token vocabulary, against the analytic KL
    gradients: k2 -> grad KL(pi||ref), k3 -> grad KL(ref||pi), k1 -> 0."""
    torch.manual_seed(1)
    logits, ref_logits = torch.randn(5), torch.randn(5)
    lg = logits.clone().requires_grad_(True)
    logp_all = lg.log_softmax(-1)  # log pi(y) for every y, as a [1, V] "batch of samples"
    est = KL_ESTIMATORS.build(name, clamp=None)(
        KLInput(logp_all[None], ref_logits.log_softmax(-1)[None])
    ).kl[0]
    probs = logits.softmax(-1).detach()  # expectation weights, not differentiated
    (g,) = torch.autograd.grad((probs * est).sum(), lg)
    rev, fwd = exact_gradients(logits, ref_logits)
    expected = {"reverse": rev, "forward": fwd, "zero": torch.zeros(5)}[target]
    assert_close(g, expected, atol=1e-6, rtol=1e-5)


def test_mask_zeroes_value_and_gradient():
    logp = torch.tensor(LOGP, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    out = KL_ESTIMATORS.build("k3")(KLInput(logp, torch.tensor(REF), mask))
    out.kl.sum().backward()
    assert out.kl[0, 1] == 0 and logp.grad[0, 1] == 0


def test_clamp_bounds_extreme_log_ratios():
    kl = KL_ESTIMATORS.build("k3", clamp=10.0)(
        KLInput(torch.tensor([[0.0]]), torch.tensor([[100.0]]))
    ).kl
    assert torch.isfinite(kl).all() and kl.item() == pytest.approx(math.exp(10) - 11)
