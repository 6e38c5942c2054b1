import pytest
import torch

from rlpost.diffusion.objectives import (
    awm_loss,
    normguard,
    ram_target,
    regression_loss,
    renoise,
    sample_sigmas,
    sde_policy_loss,
    step_mean_kl,
)


def test_sde_policy_loss_gradient_unclipped_and_clipped():
    old = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -2.0])
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = sde_policy_loss(logp, old, adv, clip_range=0.1)
    loss.sum().backward()
    # ratio 1: d/dlogp of -(r A) averaged over 3 steps = -A / 3
    assert torch.allclose(logp.grad, -adv[:, None].expand(2, 3) / 3)
    assert metrics["clip_frac"] == 0.0
    logp2 = torch.full((2, 3), 0.5, requires_grad=True)  # ratio e^0.5 > 1.1
    loss2, m2 = sde_policy_loss(logp2, old, adv, clip_range=0.1)
    loss2.sum().backward()
    assert torch.equal(logp2.grad[0], torch.zeros(3))  # A > 0 above the clip: no gradient
    assert (logp2.grad[1] != 0).all()  # A < 0: min() keeps the unclipped, larger penalty
    assert m2["clip_frac"] == pytest.approx(0.5)


def test_step_mean_kl_equals_gaussian_kl():
    g = torch.Generator().manual_seed(1)
    mu, mu_ref = torch.randn(3, 1, 2, 2, generator=g), torch.randn(3, 1, 2, 2, generator=g)
    std = torch.tensor(0.3)
    p, q = torch.distributions.Normal(mu, std), torch.distributions.Normal(mu_ref, std)
    ref = torch.distributions.kl_divergence(p, q).flatten(1).mean(1)
    assert torch.allclose(step_mean_kl(mu, mu_ref, std), ref, atol=1e-6)


def test_ram_target_hand_worked_and_zero_advantage_is_pretraining_target():
    v_ref, v_old, u = torch.full((2, 2), 1.0), torch.full((2, 2), 0.5), torch.full((2, 2), 2.0)
    t = ram_target(v_ref, v_old, u, torch.tensor([0.0, 1.0]), m=3.0)
    assert torch.equal(t[0], v_ref[0])
    assert torch.allclose(t[1], torch.full((2,), 1.0 + 3.0 * 1.0 * 1.5))


def _gauss_v(mu, sigma, x):
    """Exact velocity at x_sigma for data N(mu, 1)."""
    m, var = (1 - sigma) * mu, (1 - sigma) ** 2 + sigma**2
    return sigma / var * (x - m) - mu - (1 - sigma) / var * (x - m)


def test_ram_regression_recovers_the_reward_tilted_velocity():
    # Data N(0, 1), reward r(x0) = x0. The KL-regularised optimum with strength m tilts
    # N(0,1) by exp(m x0) into N(m, 1). To first order in m its velocity is
    # v_ref + m * d v_mu / d mu, computed here by finite differences of the exact Gaussian
    # velocity (independent of the RAM code). Least squares of RAM's targets on x must
    # recover it.
    torch.manual_seed(0)
    n, sigma, m = 400_000, 0.6, 0.05
    x0, eps = torch.randn(n, 1, dtype=torch.float64), torch.randn(n, 1, dtype=torch.float64)
    xs, u = renoise(x0, torch.full((n,), sigma, dtype=torch.float64), eps)
    v_ref = _gauss_v(0.0, sigma, xs)
    adv = x0.squeeze(1)  # r - E r
    target = ram_target(v_ref, v_ref, u, adv, m)
    feats = torch.cat([torch.ones_like(xs), xs], 1)
    coef = torch.linalg.lstsq(feats, target).solution.squeeze(1)
    h = 1e-4
    dv = (_gauss_v(h, sigma, xs) - _gauss_v(-h, sigma, xs)) / (2 * h)
    expected = torch.linalg.lstsq(feats, v_ref + m * dv).solution.squeeze(1)
    assert torch.allclose(coef, expected, atol=3e-3)
    # and the tilted velocity moves samples toward higher reward: it lowers v (dx/dsigma)
    assert coef[0] < 0


def test_awm_loss_pulls_positive_and_pushes_negative():
    u = torch.zeros(2, 4)
    v = torch.ones(2, 4, requires_grad=True)
    awm_loss(v, u, torch.tensor([1.0, -1.0])).sum().backward()
    assert (v.grad[0] > 0).all() and (v.grad[1] < 0).all()  # descent: row 0 -> u, row 1 away
    assert torch.allclose(regression_loss(v, u), torch.ones(2))


@pytest.mark.parametrize("form", ["hinge", "squared_hinge", "relative"])
def test_normguard_is_one_sided_and_radial(form):
    v_ref = torch.ones(3, 4)  # norm 2
    v = torch.stack([torch.ones(4) * 0.5, torch.ones(4) * 0.9, torch.tensor([3.0, 1, 1, 1])])
    v.requires_grad_(True)
    pen = normguard(v, v_ref, form)
    assert torch.equal(pen[:2], torch.zeros(2))  # below the reference norm: inactive
    assert pen[2] > 0
    pen.sum().backward()
    assert torch.equal(v.grad[:2], torch.zeros(2, 4))
    g, d = v.grad[2], v.detach()[2]
    assert torch.allclose(g / g.norm(), d / d.norm(), atol=1e-6)  # shrinks along v only
    n = float(d.norm())
    expected = {"hinge": n - 2, "squared_hinge": (n - 2) ** 2, "relative": n / 2 - 1}[form]
    assert float(pen[2].detach()) == pytest.approx(expected, rel=1e-6)


def test_normguard_margin_and_bad_form():
    v, v_ref = torch.full((1, 4), 1.05), torch.ones(1, 4)
    assert normguard(v, v_ref, "relative", margin=0.1).item() == 0.0
    with pytest.raises(ValueError, match="NormGuard form"):
        normguard(v, v_ref, "l1")


def test_sample_sigmas_logit_normal_and_uniform():
    g = torch.Generator().manual_seed(0)
    s = sample_sigmas(20_000, "logit_normal", generator=g)
    assert s.min() > 0 and s.max() < 1
    assert s.median() == pytest.approx(0.5, abs=0.02)
    shifted = sample_sigmas(20_000, "logit_normal", loc=1.0, generator=g)
    assert shifted.median() == pytest.approx(float(torch.sigmoid(torch.tensor(1.0))), abs=0.02)
    assert sample_sigmas(10_000, "uniform", generator=g).mean() == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError, match="sigma distribution"):
        sample_sigmas(3, "beta")
