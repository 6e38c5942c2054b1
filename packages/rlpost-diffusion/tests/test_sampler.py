import math

import pytest
import torch

from rlpost.diffusion.sampler import (
    flow_grpo_diffusion,
    flow_sigmas,
    gaussian_logprob,
    ode_step,
    sde_step,
)
from rlpost.diffusion.samplers import SAMPLERS, sample, step
from rlpost.diffusion.samplers.dance import DanceParams


def _t(v):
    return torch.tensor([[v]], dtype=torch.float64)


def test_flow_grpo_step_hand_worked():
    # x=1, v=0.5, sigma 0.5 -> 0.25, a=0.7: s = 0.7 sqrt(0.5/0.5) = 0.7
    # drift = 0.5 + 0.49/(2*0.5) * (1 + 0.5*0.5) = 1.1125; mean = 1 - 0.25*1.1125 = 0.721875
    # std = 0.7 * sqrt(0.25) = 0.35; with z = 1: x_next = 1.071875
    s = flow_grpo_diffusion(0.5, sigma_max=0.9, a=0.7)
    assert float(s) == pytest.approx(0.7)
    out = sde_step(_t(1.0), _t(0.5), 0.5, 0.25, s.double(), noise=_t(1.0))
    assert float(out.mean) == pytest.approx(0.721875)
    assert float(out.std) == pytest.approx(0.35)
    assert float(out.x_next) == pytest.approx(1.071875)
    # log N(mean + std; mean, std^2) = -1/2 - log 0.35 - log sqrt(2 pi)
    assert float(out.logprob) == pytest.approx(-0.5 - math.log(0.35) - 0.5 * math.log(2 * math.pi))


def test_dance_step_hand_worked_with_its_own_score_form():
    # DanceGRPO writes the score with x0_hat = x - sigma v: -(x - (1 - sigma) x0_hat) / sigma^2
    x, v, sig, nxt, eta = 1.0, 0.5, 0.5, 0.25, 0.3
    x0_hat = x - sig * v  # 0.75
    score = -(x - (1 - sig) * x0_hat) / sig**2  # -2.5
    mean = x + (nxt - sig) * (v - 0.5 * eta**2 * score)  # 0.846875
    assert mean == pytest.approx(0.846875)
    out = step("dance", _t(x), _t(v), sig, nxt, params=DanceParams(eta), noise=_t(0.0))
    assert float(out.mean) == pytest.approx(mean)
    assert float(out.std) == pytest.approx(eta * math.sqrt(sig - nxt))
    assert float(out.x_next) == pytest.approx(mean)


def test_flow_grpo_coefficient_uses_sigma_max_at_pure_noise():
    s = flow_grpo_diffusion(torch.tensor([1.0, 0.5]), sigma_max=0.9, a=0.7)
    assert s[0] == pytest.approx(0.7 * math.sqrt(1 / 0.1))
    assert torch.isfinite(s).all()


def test_ode_step_equals_diffusers_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(6)
    sigmas = flow_sigmas(6, shift=3.0)
    assert torch.allclose(sigmas, sched.sigmas.float())
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(2, 1, 4, 4, generator=g), torch.randn(2, 1, 4, 4, generator=g)
    ours = ode_step(x, v, sigmas[2], sigmas[3])
    ref = sched.step(v, sched.timesteps[2], x, return_dict=False)[0]
    assert torch.allclose(ours, ref, atol=1e-6)
    assert step("ode", x, v, sigmas[2], sigmas[3]).logprob is None


def test_stored_transition_logprob_matches_sampling_and_is_differentiable():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1, 2, 2, generator=g)
    v = torch.randn(3, 1, 2, 2, generator=g, requires_grad=True)
    first = step("flow_grpo", x, v.detach(), 0.6, 0.4, sigma_max=0.9, generator=g)
    again = step("flow_grpo", x, v, 0.6, 0.4, sigma_max=0.9, x_next=first.x_next)
    assert torch.allclose(first.logprob, again.logprob)
    again.logprob.sum().backward()
    assert v.grad is not None and v.grad.abs().sum() > 0
    # independent formula: torch.distributions, mean over the 4 elements
    dist = torch.distributions.Normal(again.mean.detach(), again.std)
    assert torch.allclose(again.logprob, dist.log_prob(first.x_next).flatten(1).mean(1), atol=1e-6)
    assert torch.allclose(
        gaussian_logprob(first.x_next, again.mean, again.std, reduce="sum"),
        dist.log_prob(first.x_next).flatten(1).sum(1),
        atol=1e-5,
    )


def test_per_sample_sigmas_broadcast():
    x, v = torch.ones(2, 1, 2, 2), torch.ones(2, 1, 2, 2)
    out = step("dance", x, v, torch.tensor([0.5, 0.8]), torch.tensor([0.25, 0.6]), noise=0 * x)
    single = step("dance", x[1:], v[1:], 0.8, 0.6, noise=0 * x[1:])
    assert torch.allclose(out.mean[1:], single.mean)


def _gaussian_velocity(mu: float, tau: float):
    """Exact velocity E[eps - x0 | x_sigma] for data x0 ~ N(mu, tau^2)."""

    def v(x, sigma, cond):
        s = sigma.reshape(-1, *([1] * (x.dim() - 1)))
        m, var = (1 - s) * mu, (1 - s) ** 2 * tau**2 + s**2
        return s / var * (x - m) - mu - (1 - s) * tau**2 / var * (x - m)

    return v


@pytest.mark.parametrize("kind", SAMPLERS.names())
def test_all_samplers_preserve_the_data_marginal(kind):
    # with the exact velocity of a Gaussian data law, every sampler ends at that law
    torch.manual_seed(0)
    mu, tau, n = 1.5, 0.5, 4000
    cond = {"labels": torch.zeros(n, dtype=torch.long)}
    traj = sample(_gaussian_velocity(mu, tau), cond, (1,), kind=kind, num_steps=200)
    x0 = traj.x0.flatten()
    assert x0.mean() == pytest.approx(mu, abs=0.05)
    assert x0.std() == pytest.approx(tau, abs=0.05)
    assert traj.xs.shape == (n, 201, 1)
    assert (traj.logprobs is None) == (not SAMPLERS.get(kind).stochastic)


def test_sample_records_velocity_norm_ratio():
    cond = {"labels": torch.zeros(4, dtype=torch.long)}
    v = _gaussian_velocity(0.0, 1.0)
    traj = sample(v, cond, (3,), num_steps=5, reference=lambda x, s, c: 2 * v(x, s, c))
    assert traj.velocity_norm_ratio.shape == (4, 5)
    assert torch.allclose(traj.velocity_norm_ratio[:, 1:], torch.full((4, 4), 0.5))


def test_shared_init_noise_and_generator_determinism():
    cond = {"labels": torch.zeros(2, dtype=torch.long)}
    v = _gaussian_velocity(0.0, 1.0)
    a = sample(v, cond, (3,), kind="dance", generator=torch.Generator().manual_seed(3))
    b = sample(v, cond, (3,), kind="dance", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.xs, b.xs)
    noise = torch.randn(1, 3).expand(2, 3)
    c = sample(v, cond, (3,), kind="ode", init_noise=noise)
    assert torch.equal(c.xs[0], c.xs[1])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_steps"):
        flow_sigmas(0)
    with pytest.raises(ValueError, match="unknown diffusion sampler 'euler'"):
        step("euler", torch.zeros(1, 1), torch.zeros(1, 1), 0.5, 0.4)
    with pytest.raises(ValueError, match="eta must be > 0"):
        SAMPLERS.params("dance", {"eta": 0.0})
    with pytest.raises(ValueError, match="'b'"):
        SAMPLERS.params("flow_grpo", {"b": 1.0})


@pytest.mark.parametrize("kind", SAMPLERS.names())
def test_every_sampler_at_zero_noise_is_the_euler_step_and_replays_at_ratio_one(kind):
    """Golden values of every registered sampler: with no noise drawn its next state is
    its step mean, the ODE's is plain Euler exactly (no log-probability); a stochastic
    sampler's own sample, re-scored with the same velocity, has log-ratio exactly 0."""
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(3, 1, 2, 2, generator=g), torch.randn(3, 1, 2, 2, generator=g)
    quiet = step(kind, x, v, 0.6, 0.4, sigma_max=0.9, noise=torch.zeros_like(x))
    assert torch.equal(quiet.x_next, quiet.mean)
    euler = x + (torch.tensor(0.4) - torch.tensor(0.6)) * v  # (float32 sigmas, as the step's)
    if not SAMPLERS.get(kind).stochastic:
        assert quiet.logprob is None and torch.equal(quiet.x_next, euler)
        return
    drawn = step(kind, x, v, 0.6, 0.4, sigma_max=0.9, generator=g)
    replay = step(kind, x, v, 0.6, 0.4, sigma_max=0.9, x_next=drawn.x_next)
    assert torch.equal(replay.logprob - drawn.logprob, torch.zeros(3))
    # (the SDE mean moves off Euler by the score correction, which vanishes as s -> 0)
    assert not torch.allclose(quiet.mean, euler)
