"""LWD's learner (catalog 001-23): DIVL's value distribution and QAM's adjoint matching,
checked against hand-worked values, closed forms and autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlpost.robot.algos.lwd import (
    LWDConfig,
    LWDLearner,
    adaptive_tau,
    adjoint_matching_loss,
    categorical_projection,
    distribution_quantile,
    divl_value_loss,
    lean_adjoint,
    memoryless_g2,
    memoryless_trajectory,
    normalized_entropy,
    sparse_rewards,
)
from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

torch.set_num_threads(1)

# ----------------------------------------------------------------------- DIVL


def test_projection_hand_worked_and_mean_preserving():
    support = torch.tensor([0.0, 0.5, 1.0])
    m = categorical_projection(torch.tensor([0.25, 0.5, 1.3, -2.0, 0.9]), support)
    expected = torch.tensor(
        [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.2, 0.8]]
    )
    assert torch.allclose(m, expected, atol=1e-6)
    v = torch.linspace(-0.3, 1.4, 101)
    sup = torch.linspace(-0.1, 1.1, 51)
    p = categorical_projection(v, sup)
    assert torch.allclose(p.sum(1), torch.ones(101))
    assert torch.allclose(p @ sup, v.clamp(-0.1, 1.1), atol=1e-5)


def test_quantile_is_the_first_atom_whose_cdf_reaches_tau():
    support = torch.tensor([0.0, 1.0, 2.0])
    probs = torch.tensor([[0.2, 0.3, 0.5]]).repeat(5, 1)
    tau = torch.tensor([0.2, 0.21, 0.5, 0.51, 1.0])
    assert distribution_quantile(probs, support, tau).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0]


def test_adaptive_tau_is_lower_for_spread_distributions_and_clipped():
    k = 11
    one_hot = torch.zeros(1, k)
    one_hot[0, 3] = 1.0
    uniform = torch.full((1, k), 1.0 / k)
    assert normalized_entropy(one_hot).item() == pytest.approx(0.0, abs=1e-6)
    assert normalized_entropy(uniform).item() == pytest.approx(1.0, abs=1e-6)
    assert adaptive_tau(one_hot, 0.9, 0.3, 0.1, 0.95).item() == pytest.approx(0.9)
    assert adaptive_tau(uniform, 0.9, 0.3, 0.1, 0.95).item() == pytest.approx(0.6)
    assert adaptive_tau(uniform, 0.3, 0.3, 0.1, 0.95).item() == pytest.approx(0.1)  # clipped
    mixes = torch.stack([(1 - w) * one_hot[0] + w * uniform[0] for w in np.linspace(0, 1, 6)])
    taus = adaptive_tau(mixes, 0.9, 0.3, 0.1, 0.95)
    assert (taus[1:] <= taus[:-1] + 1e-7).all()


def test_fitted_distribution_quantile_equals_the_direct_quantile_regression_optimum():
    """Proposition 1: fit p(v|s) by cross-entropy to a state's values, then take its
    tau-quantile; it equals the minimiser of the pinball loss over the same values."""
    g = torch.Generator().manual_seed(0)
    support = torch.linspace(0.0, 1.0, 21)
    idx = torch.randint(0, 21, (400,), generator=g)
    values = support[torch.where(idx > 12, idx, idx // 2)]  # skewed, on the atoms
    logits = torch.zeros(1, 21, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    for _ in range(800):
        loss = divl_value_loss(logits.expand(400, -1), values, support)
        opt.zero_grad()
        loss.backward()
        opt.step()
    probs = torch.softmax(logits, 1)
    for tau in (0.1, 0.3, 0.5, 0.77, 0.9):
        fitted = distribution_quantile(probs, support, tau).item()
        pinball = [
            torch.where(values >= z, tau * (values - z), (1 - tau) * (z - values)).mean()
            for z in support
        ]
        direct = support[int(torch.stack(pinball).argmin())].item()
        assert fitted == pytest.approx(direct, abs=1e-6), tau


def test_divl_backup_is_more_pessimistic_where_the_value_is_uncertain():
    """Heterogeneous data at s': half the replayed actions succeed (value 1), half fail
    (value 0). The value distribution learns both modes; the bootstrap quantile with tau
    0.9 is the success mode and a high entropy pulls tau (and the target) down."""
    cfg = LWDConfig(atoms=11, v_min=0.0, v_max=1.0, hidden=32, critic_lr=3e-3, seed=0)
    pol = FlowChunkPolicy(FlowPolicyConfig(obs_dim=2, act_dim=1, horizon=1, hidden=16, n_blocks=1))
    ln = LWDLearner(pol, cfg)
    obs = torch.tensor([[1.0, 0.0]]).repeat(64, 1)
    chunks = torch.cat([torch.ones(32, 1, 1), -torch.ones(32, 1, 1)])
    q_true = (chunks[:, 0, 0] > 0).float()  # success action 1, failure action 0
    for _ in range(400):  # fit the target critic exactly, then the value distribution
        q1, q2 = ln.critic.q(obs, chunks)
        loss = ((q1 - q_true) ** 2).mean() + ((q2 - q_true) ** 2).mean()
        ln.q_opt.zero_grad()
        loss.backward()
        ln.q_opt.step()
    ln.target.load_state_dict(ln.critic.state_dict())
    for _ in range(300):
        loss = divl_value_loss(
            ln.critic.value_logits(obs),
            torch.minimum(*ln.target.q(obs, chunks)).detach(),
            ln.critic.support,
        )
        ln.v_opt.zero_grad()
        loss.backward()
        ln.v_opt.step()
    p = ln.critic.value_probs(obs[:1])
    assert p[0, 0].item() == pytest.approx(0.5, abs=0.1)
    assert p[0, -1].item() == pytest.approx(0.5, abs=0.1)
    sup = ln.critic.support
    assert distribution_quantile(p, sup, 0.9).item() == pytest.approx(1.0, abs=0.11)
    assert distribution_quantile(p, sup, 0.3).item() == pytest.approx(0.0, abs=0.11)
    tau = adaptive_tau(p, 0.9, 0.3, 0.1, 0.95)
    assert tau.item() < 0.9 - 0.3 * 0.25  # two modes: entropy log 2 / log 11 ~ 0.29


def test_sparse_rewards_are_one_on_the_last_step_of_a_success_only():
    from rlpost.robot.demos import Episode

    ok = Episode(np.zeros((4, 2)), np.zeros((3, 1)), np.ones(3), True, {})
    bad = Episode(np.zeros((4, 2)), np.zeros((3, 1)), np.ones(3), False, {})
    r_ok, r_bad = (e.rewards.tolist() for e in sparse_rewards([ok, bad]))
    assert r_ok == [0.0, 0.0, 1.0] and r_bad == [0.0, 0.0, 0.0]
    assert ok.rewards.tolist() == [1.0, 1.0, 1.0]  # the input is not changed


# ------------------------------------------------------------------------ QAM


def _gaussian_velocity(mu: float, s: float):
    """The exact flow-matching velocity of N(mu, s^2) data (sigma = 1 noise)."""

    def v(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        var = (1 - sigma) ** 2 * s**2 + sigma**2
        k = (sigma - (1 - sigma) * s**2) / var
        return -mu + k * (x - (1 - sigma) * mu)

    return v


def test_lean_adjoint_equals_autograd_through_the_base_chain():
    """With the trajectory generated by the base itself and its noise held fixed, the
    lean adjoint at every step is the gradient of the terminal objective w.r.t. x_i."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def v(x, sigma):
        return net(torch.cat([x, sigma.expand(x.shape[0], 1)], 1))

    n, h = 6, 1 / 6
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(5, 3, generator=g)
    xs = memoryless_trajectory(v, x0, n, torch.Generator().manual_seed(2))
    sig = torch.linspace(1.0, 0.0, n + 1)
    # the same chain again, differentiable, with the noise the trajectory drew
    noise = [None] * n
    for i in range(n - 1):
        drift = 2 * v(xs[i], sig[i]) + xs[i] / (1 - sig[i] + h)
        noise[i] = xs[i + 1] - (xs[i] - h * drift)

    def terminal(x):
        return (torch.sin(x) * torch.tensor([1.0, -2.0, 0.5])).sum()

    for start in range(n):
        x = xs[start].clone().requires_grad_(True)
        y = x
        for i in range(start, n):
            if i == n - 1:
                y = y - h * v(y, sig[i])
            else:
                y = y - h * (2 * v(y, sig[i]) + y / (1 - sig[i] + h)) + noise[i]
        (grad,) = torch.autograd.grad(terminal(y), x)
        xn = xs[-1].clone().requires_grad_(True)
        (g_final,) = torch.autograd.grad(terminal(xn), xn)
        adj = lean_adjoint(v, xs, g_final)
        assert torch.allclose(adj[start], grad, atol=1e-5), start


def test_lean_adjoint_matches_the_closed_form_for_a_gaussian_base_and_linear_critic():
    mu, s, c, inv_temp, n = 0.3, 0.5, 1.0, 2.0, 400
    v = _gaussian_velocity(mu, s)
    xs = memoryless_trajectory(v, torch.randn(64, 1, generator=torch.Generator().manual_seed(0)), n)
    adj = lean_adjoint(v, xs, torch.full((64, 1), -inv_temp * c))
    sig = torch.linspace(1.0, 0.0, n + 1)
    var = (1 - sig) ** 2 * s**2 + sig**2
    exact = -inv_temp * c * s**2 * (1 - sig) / var
    got = torch.stack([a[:, 0] for a in adj])  # [N + 1, B]: path-independent (affine base)
    assert torch.allclose(got, got[:, :1].expand_as(got), atol=1e-6)
    assert torch.allclose(got[:, 0], exact, atol=0.02 * inv_temp * c)


def test_adjoint_matching_optimum_samples_the_tilted_policy():
    """Fine-tuned velocity v = v_base + w_i (one free offset per step): minimising the
    loss on fresh SDE trajectories drives w_i to g_i^2 a_i / 2, and the ODE samples of
    the result have the tilted law N(mu + inv_temp c s^2, s^2)."""
    mu, s, c, inv_temp, n = 0.0, 0.4, 1.0, 1.5, 20
    vb = _gaussian_velocity(mu, s)
    w = torch.zeros(n + 1, requires_grad=True)
    sig = torch.linspace(1.0, 0.0, n + 1)

    def vf(x, sigma):
        i = int(torch.argmin((sig - sigma).abs()))
        return vb(x, sigma) + w[i]

    opt = torch.optim.Adam([w], lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        xs = memoryless_trajectory(vf, torch.randn(256, 1, generator=gen), n, gen)
        adj = lean_adjoint(vb, xs, torch.full((256, 1), -inv_temp * c))
        loss = adjoint_matching_loss(vf, vb, xs, adj)
        opt.zero_grad()
        loss.backward()
        opt.step()
    h = 1 / n
    target = torch.stack([memoryless_g2(sig[i], h) * adj[i][0, 0] / 2 for i in range(n)])
    assert torch.allclose(w[:n].detach(), target, atol=0.02)
    x = torch.randn(20000, 1, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for i in range(n):
            x = x + (sig[i + 1] - sig[i]) * vf(x, sig[i])
    shift = inv_temp * c * s**2  # 20 steps: O(h) short of it (the next test refines)
    assert x.mean().item() == pytest.approx(mu + shift, abs=0.2 * shift)
    assert x.std().item() == pytest.approx(s, rel=0.1)


def test_the_discrete_optimum_converges_to_the_tilted_mean():
    """The optimum v_base + g_i^2 a_i / 2 on a fine grid: samples N(mu + inv_temp c s^2, s^2)
    to 3 % (the error is O(1/N): 15 % at 20 steps, 2 % at 400)."""
    mu, s, c, inv_temp, n = 0.2, 0.4, 1.0, 1.5, 400
    vb = _gaussian_velocity(mu, s)
    xs = memoryless_trajectory(vb, torch.zeros(1, 1), n)
    adj = lean_adjoint(vb, xs, torch.full((1, 1), -inv_temp * c))
    sig = torch.linspace(1.0, 0.0, n + 1)
    x = torch.randn(20000, 1, generator=torch.Generator().manual_seed(1))
    for i in range(n):
        w = memoryless_g2(sig[i], 1 / n) * adj[i][0, 0] / 2
        x = x + (sig[i + 1] - sig[i]) * (vb(x, sig[i]) + w)
    shift = inv_temp * c * s**2
    assert x.mean().item() == pytest.approx(mu + shift, abs=0.03 * shift)
    assert x.std().item() == pytest.approx(s, rel=0.03)


def test_qam_update_is_zero_when_the_policy_is_the_base_and_the_critic_flat():
    """inv_temp = 0 (or a flat critic): the target policy is the base, so a policy equal
    to the base has zero loss and zero gradient."""
    pol = FlowChunkPolicy(FlowPolicyConfig(obs_dim=3, act_dim=2, horizon=2, hidden=16, n_blocks=1))
    torch.nn.init.normal_(pol.out[-1].weight, std=0.1)
    ln = LWDLearner(pol, LWDConfig(inv_temp=0.0, sample_steps=4))
    obs = torch.randn(8, 3)
    before = [p.detach().clone() for p in pol.parameters()]
    m = ln.policy_step(obs)
    assert m["pi_loss"] == pytest.approx(0.0, abs=1e-10)
    for p, q in zip(before, pol.parameters(), strict=True):
        assert torch.equal(p, q.detach())


def test_memoryless_schedule_is_finite_at_the_noise_end():
    h = 0.1
    assert math.isfinite(memoryless_g2(1.0, h).item())
    assert memoryless_g2(1.0, h).item() == pytest.approx(2 * 1.1 / 0.1)
    assert memoryless_g2(0.0, h).item() == pytest.approx(2 * 0.1 / 1.1)


@pytest.mark.parametrize("base", ["frozen", "replay"])
def test_the_base_is_frozen_or_follows_a_bc_fit_of_the_replay(base):
    pol = FlowChunkPolicy(FlowPolicyConfig(obs_dim=3, act_dim=2, horizon=2, hidden=16, n_blocks=1))
    ln = LWDLearner(pol, LWDConfig(base=base, sample_steps=2, base_ema=0.5, hidden=16, atoms=5))
    before = {k: v.clone() for k, v in ln.base.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(8, 3, generator=g),
        "chunks": torch.rand(8, 2, 2, generator=g) * 2 - 1,
        "mask": torch.ones(8, 2),
        "returns": torch.rand(8, generator=g),
        "next_obs": torch.randn(8, 3, generator=g),
        "discount": torch.full((8,), 0.9),
    }
    m = ln.update(batch)
    moved = any(not torch.equal(v, before[k]) for k, v in ln.base.state_dict().items())
    if base == "frozen":
        assert not moved and "base_fit" not in ln.modules() and "base_loss" not in m
    else:  # the base is the EMA of a flow fitted by BC to the batch
        assert moved and "base_fit" in ln.modules() and m["base_loss"] > 0
        for k, v in ln.base_fit.state_dict().items():
            if v.dtype.is_floating_point and not k.startswith(("obs_", "act_")):
                assert torch.allclose(ln.base.state_dict()[k], 0.5 * (before[k] + v), atol=1e-6)
    with pytest.raises(ValueError, match="base must be"):
        LWDConfig(base="moving")
