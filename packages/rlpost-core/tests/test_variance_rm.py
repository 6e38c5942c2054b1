"""Anchor-guided variance-aware reward modelling (000-28): pairwise preferences leave a
Gaussian reward's scale free, two anchors identify it, and a fit on simulated judges
recovers each response's mean and variance."""

import math

import pytest
import torch

from rlpost.core.variance_rm import (
    anchor_probability,
    best_of_n,
    bradley_terry_loss,
    identify_from_anchors,
    preference_probability,
    risk_adjusted,
    variance_aware_loss,
)


def test_hand_worked_probabilities():
    one = torch.tensor(1.0)
    # mu1 - mu2 = 1, var1 + var2 = 1: Phi(1)
    p = preference_probability(one, torch.tensor(0.5), torch.tensor(0.0), torch.tensor(0.5))
    assert float(p) == pytest.approx(0.8413447, abs=1e-5)
    assert float(anchor_probability(one, torch.tensor(4.0), 0.0)) == pytest.approx(
        0.6914625, abs=1e-5
    )
    mu, sigma = identify_from_anchors(torch.tensor(0.6914625), torch.tensor(0.5), (0.0, 1.0))
    assert float(mu) == pytest.approx(1.0, abs=1e-4) and float(sigma) == pytest.approx(
        2.0, abs=1e-3
    )


def test_pairwise_preferences_leave_the_scale_free_and_two_anchors_fix_it():
    g = torch.Generator().manual_seed(0)
    mu_a, mu_b = torch.randn(50, generator=g), torch.randn(50, generator=g)
    lv_a, lv_b = torch.randn(50, generator=g) * 0.3, torch.randn(50, generator=g) * 0.3
    pref = torch.rand(50, generator=g)
    labels = (torch.rand(50, 2, generator=g) < 0.5).float()

    def loss(c, anchors):
        kw = dict(anchor_mu=c * mu_a, anchor_logvar=lv_a + 2 * math.log(c), anchor_labels=labels)
        return variance_aware_loss(c * mu_a, lv_a + 2 * math.log(c), c * mu_b,
                                   lv_b + 2 * math.log(c), pref, **(kw if anchors else {}))  # fmt: skip

    # (mu, sigma) -> (2 mu, 2 sigma): every pairwise probability, hence the loss, unchanged
    assert float(loss(2.0, False)) == pytest.approx(float(loss(1.0, False)), rel=1e-5)
    assert abs(float(loss(2.0, True)) - float(loss(1.0, True))) > 1e-3  # the anchors see it


def _simulate(seed: int, n_items=120, n_pairs=3000, judges=16, thresholds=(0.0, 1.0)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_items, 4, generator=g)
    mu = x @ torch.tensor([0.8, -0.5, 0.3, 0.0]) + 0.5
    sigma = torch.exp(x @ torch.tensor([0.0, 0.2, -0.3, 0.5]) - 0.2)
    draws = mu[:, None] + sigma[:, None] * torch.randn(n_items, judges, generator=g)
    a = torch.randint(n_items, (n_pairs,), generator=g)
    b = torch.randint(n_items, (n_pairs,), generator=g)
    ja = mu[a, None] + sigma[a, None] * torch.randn(n_pairs, judges, generator=g)
    jb = mu[b, None] + sigma[b, None] * torch.randn(n_pairs, judges, generator=g)
    prefer = (ja > jb).float().mean(1)  # soft labels: the share of judges preferring a
    anchors = torch.stack([(draws > t).float().mean(1) for t in thresholds], 1)
    return x, mu, sigma, a, b, prefer, anchors


def _fit(x, a, b, prefer, anchors, steps=600, log_sigma0=0.0):
    w = torch.zeros(4, 2, requires_grad=True)
    c = torch.tensor([0.0, log_sigma0], requires_grad=True)
    opt = torch.optim.Adam([w, c], lr=0.05)
    for _ in range(steps):
        out = x @ w + c
        mu, lv = out[:, 0], 2 * out[:, 1]
        loss = variance_aware_loss(mu[a], lv[a], mu[b], lv[b], prefer, *(
            (mu, lv, anchors) if anchors is not None else (None, None, None)))  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = (x @ w + c).detach()
    return out[:, 0], out[:, 1].exp()


def test_anchors_recover_the_mean_and_the_variance_of_simulated_judges():
    x, mu, sigma, a, b, prefer, anchors = _simulate(0)
    for start in (0.0, math.log(5.0)):  # wherever the fit starts
        got_mu, got_sigma = _fit(x, a, b, prefer, anchors, log_sigma0=start)
        assert (got_mu - mu).abs().mean() < 0.1 and (got_sigma - sigma).abs().mean() < 0.1
    # pairwise preferences alone fit as well at another scale: started at 5x the
    # judges' spread, the fit keeps a wrong scale (and every pairwise probability right)
    free_mu, free_sigma = _fit(x, a, b, prefer, None, log_sigma0=math.log(5.0))
    assert (free_sigma / sigma).mean() > 1.5
    p_true = preference_probability(mu[a], sigma[a] ** 2, mu[b], sigma[b] ** 2)
    p_free = preference_probability(free_mu[a], free_sigma[a] ** 2, free_mu[b], free_sigma[b] ** 2)
    assert (p_free - p_true).abs().mean() < 0.01


def test_bradley_terry_cannot_express_disagreement():
    """Two responses with the same mean: BT gives them a 50/50 preference whatever their
    spread; the Gaussian's probabilities differ only through the variances."""
    r = torch.tensor([0.0, 0.0])
    assert float(bradley_terry_loss(r[:1], r[1:], torch.tensor([0.5]))) == pytest.approx(
        math.log(2)
    )
    p_narrow = preference_probability(
        torch.tensor(1.0), torch.tensor(0.01), torch.tensor(0.0), torch.tensor(0.01)
    )
    p_wide = preference_probability(
        torch.tensor(1.0), torch.tensor(4.0), torch.tensor(0.0), torch.tensor(4.0)
    )
    assert float(p_narrow) > 0.99 and 0.6 < float(p_wide) < 0.7


def test_risk_adjusted_best_of_n_prefers_the_reliable_candidate():
    mu = torch.tensor([[1.0, 0.9, 0.2]])
    var = torch.tensor([[1.0, 0.01, 0.01]])
    assert best_of_n(mu, var).tolist() == [0]  # the mean alone
    assert best_of_n(mu, var, kappa=1.0).tolist() == [1]  # 1 - 1 < 0.9 - 0.1
    assert torch.allclose(risk_adjusted(mu, var, 1.0), torch.tensor([[0.0, 0.8, 0.1]]))
