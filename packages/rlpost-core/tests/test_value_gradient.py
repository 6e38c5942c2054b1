"""The value-gradient view (000-11): the leave-one-out estimator is the value gradient in
expectation (the paper's first result, checked exactly on a bandit), the streaming signal
and noise match hand-worked values and are unbiased, and headroom is reachable minus mean."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlpost.core.value_gradient import (
    GradientMoments,
    criterion,
    headroom,
    loo_weights,
    prompt_signal_sq,
)


def test_leave_one_out_weights_by_hand():
    w = loo_weights(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # r_0 = 1, the others' mean 1/3: (1 - 1/3) / 4; r_1 = 0, the others' mean 2/3
    assert w.tolist() == pytest.approx([1 / 6, -1 / 6, -1 / 6, 1 / 6])
    assert loo_weights(torch.ones(3, 5)).abs().sum() == 0  # equal rewards: no signal, no NaN
    with pytest.raises(ValueError, match="k >= 2"):
        loo_weights(torch.ones(4, 1))


def _expected_estimate(theta: torch.Tensor, r: torch.Tensor, k: int, weights) -> torch.Tensor:
    """E over every k-tuple of arms of sum_i w_i grad log pi(a_i), enumerated exactly."""
    pi = torch.softmax(theta, 0)
    score = torch.eye(len(theta)) - pi  # grad_theta log pi(a) = e_a - pi
    total = torch.zeros_like(theta)
    for arms in itertools.product(range(len(theta)), repeat=k):
        a = torch.tensor(arms)
        total += pi[a].prod() * (weights(r[a])[:, None] * score[a]).sum(0)
    return total


def test_the_leave_one_out_estimate_is_the_value_gradient_in_expectation():
    theta = torch.tensor([0.3, -0.5, 1.1, 0.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([1.0, 0.0, 0.5, 0.2], dtype=torch.float64)
    (grad_j,) = torch.autograd.grad((torch.softmax(theta, 0) * r).sum(), theta)
    t = theta.detach()
    for k in (2, 3, 4):
        assert torch.allclose(_expected_estimate(t, r, k, loo_weights), grad_j, atol=1e-12)
        # the plain group-mean baseline is biased by (k - 1) / k: the test can tell them apart
        mean_base = _expected_estimate(t, r, k, lambda x: (x - x.mean()) / len(x))
        assert torch.allclose(mean_base, grad_j * (k - 1) / k, atol=1e-12)


def test_a_prompts_signal_is_its_value_gradients_squared_norm_in_expectation():
    theta = torch.tensor([0.3, -0.5, 1.1, 0.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([1.0, 0.0, 0.5, 0.2], dtype=torch.float64)
    (grad_j,) = torch.autograd.grad((torch.softmax(theta, 0) * r).sum(), theta)
    pi = torch.softmax(theta.detach(), 0)
    score = torch.eye(4, dtype=torch.float64) - pi
    for k in (3, 4):
        expected = 0.0
        for arms in itertools.product(range(4), repeat=k):
            a = torch.tensor(arms)
            expected += float(pi[a].prod()) * prompt_signal_sq(r[a], score[a] @ score[a].T)
        assert expected == pytest.approx(float(grad_j.square().sum()), abs=1e-12)
    # by hand, k = 3: c_01 = r_2 = 0, so the pair (0, 1) gives r_0 r_1 G_01 = 1 * 1 * 2
    g = torch.tensor([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert prompt_signal_sq(torch.tensor([1.0, 1.0, 0.0]), g) == pytest.approx(2 * 2 / 6)
    with pytest.raises(ValueError, match="k >= 3"):
        prompt_signal_sq(torch.ones(2), torch.eye(2))


def test_signal_and_noise_by_hand():
    m = GradientMoments()
    m.add(torch.tensor([1.0, 1.0]))
    m.add(torch.tensor([3.0, 1.0]))
    assert m.signal_sq() == pytest.approx(4.0)  # <g1, g2> = 3 + 1
    assert m.noise() == pytest.approx(2.0)  # ||(-1, 0)||^2 + ||(1, 0)||^2, over P - 1 = 1
    s = m.summary()
    assert s["batch_signal"] == pytest.approx(2.0) and s["snr"] == pytest.approx(2.0)
    orth = GradientMoments()
    orth.add(torch.tensor([1.0, 0.0]))
    orth.add(torch.tensor([0.0, 1.0]))
    assert orth.signal_sq() == pytest.approx(0.0) and orth.noise() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2"):
        GradientMoments().signal_sq()


def test_the_signal_is_unbiased_where_the_mean_gradients_norm_is_not():
    g = torch.Generator().manual_seed(0)
    mu = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5])
    est, naive = [], []
    for _ in range(3000):
        m = GradientMoments()
        draws = mu + torch.randn(4, 5, generator=g)
        for d in draws:
            m.add(d)
        est.append(m.signal_sq())
        naive.append(float(draws.mean(0).square().sum()))
    truth = float(mu.square().sum())  # 0.39; the naive one adds trace(cov) / P = 5 / 4
    assert sum(est) / len(est) == pytest.approx(truth, abs=0.06)
    assert sum(naive) / len(naive) == pytest.approx(truth + 1.25, abs=0.1)


def test_headroom_is_the_best_sample_minus_the_mean():
    r = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    h = headroom(r)
    assert h["mean_reward"] == pytest.approx(5 / 12)
    assert h["reachable_reward"] == pytest.approx(2 / 3)
    assert h["headroom"] == pytest.approx(0.25)  # only the first prompt has room
    assert criterion(0.0, 0.7) == 0.0 and criterion(2.0, 0.25) == 0.5
    with pytest.raises(ValueError, match="prompts, samples"):
        headroom(torch.ones(4))
