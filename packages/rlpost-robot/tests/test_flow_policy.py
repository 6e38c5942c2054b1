"""Flow-matching action-chunk policy, BC and the receding-horizon controller.

Measured Euler-step sensitivity after BC (the numbers OTQL's straightening should improve;
the two ``test_bc_*`` tests assert looser bounds). One thread, hidden 128, 2 blocks,
400 AdamW steps of batch 256 on 4096 samples, 1000 test observations; seed 0 (the
test) and the range over seeds 1-3:

* bimodal: a chunk (H = 4, A = 1) is all +1 or all -1 with p = 1/2, independent of the obs.
  Fractions of action elements within 0.25 of a mode / with abs(a) < 0.5, and the mean
  distance to the nearest mode:

  =====  ===================  ===================  =====================
  steps  near a mode          abs(a) < 0.5         distance to mode
  =====  ===================  ===================  =====================
  1      0.01  (0.01)         0.97  (0.96-0.97)    0.84  (0.82-0.83)
  3      0.79  (0.78-0.80)    0.13  (0.12-0.14)    0.15  (0.13-0.16)
  10     0.95  (0.94-0.95)    0.03  (0.03-0.04)    0.045 (0.044-0.049)
  =====  ===================  ===================  =====================

  One step gives ``eps - v(o, eps, 1) = E[a | o] = 0``, the MSE regressor's answer (a
  trained MSE MLP predicts mean abs 0.02): the flow is curved. 10-step chunks are
  sign-coherent (99 %, vs 37 % at one step) and split 55/45 between the modes.
* deterministic ``a = f(obs)`` (obs dim 4, H = 4, A = 2, target variance 0.21): MSE
  0.020 (0.021-0.026) at 1 step, 0.0027 (0.0026-0.0040) at 3, 0.0020 (0.0021-0.0031)
  at 10. The ideal flow is straight here but the learnt one is not quite: one step
  costs ~8-10x the 10-step error.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlpost.robot.policies import (
    ChunkController,
    FlowChunkPolicy,
    FlowPolicyConfig,
    make_chunks,
    train_bc,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Two cores are shared in CI: run on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _policy(seed: int = 0, randomize_out: bool = True, **kw) -> FlowChunkPolicy:
    torch.manual_seed(seed)
    cfg = FlowPolicyConfig(**{"obs_dim": 5, "act_dim": 2, "horizon": 4, "hidden": 32} | kw)
    pi = FlowChunkPolicy(cfg)
    if randomize_out:  # a non-trivial velocity field (the output layer is zero-initialised)
        torch.nn.init.normal_(pi.out[-1].weight, std=0.1)
    return pi


def _batch(b: int, pi: FlowChunkPolicy, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    c = pi.cfg
    obs = torch.randn(b, c.obs_dim, generator=g)
    chunks = torch.randn(b, c.horizon, c.act_dim, generator=g)
    noise = torch.randn(b, c.horizon, c.act_dim, generator=g)
    sigma = torch.rand(b, generator=g)
    return obs, chunks, noise, sigma


def _grads(pi: FlowChunkPolicy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in pi.parameters()])


# ------------------------------------------------------------------ config / model


def test_config_json_round_trip_and_validation():
    cfg = FlowPolicyConfig(
        obs_dim=3, act_dim=2, obs_mean=np.zeros(3), obs_std=[1, 2, 3], act_low=(-1, -2)
    )
    assert cfg.obs_std == (1.0, 2.0, 3.0) and cfg.act_low == (-1.0, -2.0)
    assert FlowPolicyConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError):
        FlowPolicyConfig(obs_dim=3, act_dim=2, obs_mean=[0.0])
    with pytest.raises(ValueError):
        FlowPolicyConfig(obs_dim=3, act_dim=2, act_high=(1.0, 1.0, 1.0))


def test_shapes_and_zero_init_velocity():
    pi = _policy(randomize_out=False)
    obs, chunks, noise, sigma = _batch(6, pi)
    v = pi.velocity(obs, chunks, sigma)
    assert v.shape == (6, 4, 2)
    assert torch.equal(v, torch.zeros_like(v))
    assert pi.velocity(obs, chunks, 0.5).shape == (6, 4, 2)  # scalar sigma broadcasts
    # v = 0: the sample is the clamped noise
    assert torch.equal(pi.sample(obs, noise=noise), noise.clamp(-1, 1))


@pytest.mark.parametrize("n_steps", [1, 3, 10])
def test_sample_uses_n_steps_euler_steps_on_uniform_grid(n_steps):
    pi = _policy(act_low=None, act_high=None)
    obs, _, noise, _ = _batch(3, pi)
    calls = []
    orig = pi.velocity
    pi.velocity = lambda o, a, s, c=None: calls.append(float(s)) or orig(o, a, s, c)
    out = pi.sample(obs, n_steps=n_steps, noise=noise)
    assert out.shape == (3, 4, 2) and not out.requires_grad
    assert calls == pytest.approx([1 - i / n_steps for i in range(n_steps)])
    del pi.velocity
    # hand-rolled Euler integration
    x = noise.clone()
    for i in range(n_steps):
        x = x - (1 / n_steps) * pi.velocity(obs, x, 1 - i / n_steps)
    torch.testing.assert_close(out, x.detach())


def test_sample_default_steps_clamp_and_generator_determinism():
    pi = _policy(n_steps=2, act_low=(-0.5, -1.0), act_high=(0.5, 0.2))
    torch.nn.init.normal_(pi.out[-1].weight, std=3.0)  # push samples out of bounds
    obs = torch.randn(64, 5)
    a1 = pi.sample(obs, generator=torch.Generator().manual_seed(7))
    a2 = pi.sample(obs, generator=torch.Generator().manual_seed(7))
    a3 = pi.sample(obs, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)
    assert (a1[..., 0].abs() <= 0.5).all() and (a1[..., 1] >= -1).all()
    assert (a1[..., 1] <= 0.2).all() and (a1[..., 1] == 0.2).any()
    spy = []
    orig = pi.velocity
    pi.velocity = lambda o, a, s, c=None: spy.append(1) or orig(o, a, s, c)
    pi.sample(obs)
    assert len(spy) == 2  # cfg.n_steps


# ------------------------------------------------------------------ flow loss


def test_flow_loss_matches_the_rectified_flow_target():
    pi = _policy()
    obs, a, eps, sig = _batch(5, pi)
    s = sig.view(-1, 1, 1)
    want = (pi.velocity(obs, (1 - s) * a + s * eps, sig) - (eps - a)).pow(2).mean()
    torch.testing.assert_close(pi.flow_loss(obs, a, noise=eps, sigma=sig), want)


def test_flow_loss_zero_weight_sample_gets_no_gradient():
    pi = _policy()
    obs, chunks, noise, sigma = _batch(8, pi)
    chunks.requires_grad_(True)
    w = torch.tensor([1.0, 0.0, 2.0, 1.0, 0.0, 0.5, 1.0, 3.0])
    pi.flow_loss(obs, chunks, weights=w, noise=noise, sigma=sigma).backward()
    g = chunks.grad.flatten(1).abs().sum(1)
    assert (g[w == 0] == 0).all() and (g[w > 0] > 0).all()
    # parameter gradients: the zero-weight samples could be dropped (scaled by B'/B)
    pi.zero_grad()
    pi.flow_loss(obs, chunks.detach(), weights=w, noise=noise, sigma=sigma).backward()
    full = _grads(pi)
    keep = w > 0
    pi.zero_grad()
    (
        pi.flow_loss(
            obs[keep], chunks.detach()[keep], w[keep], noise=noise[keep], sigma=sigma[keep]
        )
        * keep.sum()
        / 8
    ).backward()
    torch.testing.assert_close(_grads(pi), full)


def test_flow_loss_weights_broadcast_per_sample():
    pi = _policy(horizon=8)  # B == H == 8 catches weights broadcast over the wrong axis
    obs, chunks, noise, sigma = _batch(8, pi)
    w = torch.arange(8.0)
    per = pi.flow_loss(obs, chunks, noise=noise, sigma=sigma, reduce="none")
    assert per.shape == (8,)
    got = pi.flow_loss(obs, chunks, weights=w, noise=noise, sigma=sigma)
    torch.testing.assert_close(got, (w * per).mean())
    ones = pi.flow_loss(obs, chunks, weights=torch.ones(8), noise=noise, sigma=sigma)
    torch.testing.assert_close(ones, per.mean())
    for i in (0, 5):  # per-sample loss, one sample at a time
        alone = pi.flow_loss(
            obs[i : i + 1], chunks[i : i + 1], noise=noise[i : i + 1], sigma=sigma[i : i + 1]
        )
        torch.testing.assert_close(alone, per[i])


def test_flow_loss_mask_excludes_padded_steps():
    pi = _policy()
    obs, chunks, noise, _ = _batch(4, pi)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]]).bool()
    # sigma = 1: the network input is pure noise, so the chunk enters only via the target
    # u = eps - a, and padded chunk entries must not matter at all
    sig = torch.ones(4)
    chunks.requires_grad_(True)
    loss = pi.flow_loss(obs, chunks, noise=noise, sigma=sig, mask=mask)
    loss.backward()
    assert (chunks.grad[~mask] == 0).all() and (chunks.grad[mask].abs().sum(-1) > 0).all()
    g1 = _grads(pi)
    garbage = torch.where(mask[..., None], chunks.detach(), torch.full_like(chunks, 1e3))
    pi.zero_grad()
    loss2 = pi.flow_loss(obs, garbage, noise=noise, sigma=sig, mask=mask)
    loss2.backward()
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(_grads(pi), g1)
    # the per-sample loss is the mean over that sample's valid elements
    s = sig.view(-1, 1, 1)
    err = (pi.velocity(obs, noise, sig) - (noise - chunks.detach())).pow(2).mean(-1)
    want = torch.stack([err[i][mask[i]].mean() for i in range(4)])
    torch.testing.assert_close(
        pi.flow_loss(obs, chunks, noise=noise, sigma=s.flatten(), mask=mask, reduce="none"), want
    )


@pytest.mark.parametrize("split", [6, 5])
def test_flow_loss_gradient_is_micro_batch_invariant(split):
    pi = _policy()
    obs, chunks, noise, sigma = _batch(12, pi)
    mask = torch.arange(4)[None, :] < torch.randint(
        1, 5, (12, 1), generator=torch.Generator().manual_seed(3)
    )
    w = torch.rand(12, generator=torch.Generator().manual_seed(4))

    def grad(sl):
        pi.zero_grad()
        pi.flow_loss(obs[sl], chunks[sl], w[sl], noise[sl], sigma[sl], mask[sl]).backward()
        return _grads(pi).clone()

    full = grad(slice(None))
    halves = grad(slice(0, split)) * split / 12 + grad(slice(split, None)) * (12 - split) / 12
    torch.testing.assert_close(halves, full)


# ------------------------------------------------------------------ data / io


def test_make_chunks_pads_with_last_action_and_masks():
    ep1 = SimpleNamespace(
        obs=np.arange(4, dtype=np.float32)[:, None],
        actions=np.array([[0.0], [1.0], [2.0]], np.float32),
    )
    ep2 = {
        "obs": np.array([[10.0], [11.0], [12.0]], np.float32),
        "actions": np.array([[10.0], [11.0]], np.float32),
    }
    obs, chunks, mask = make_chunks([ep1, ep2], horizon=3)
    assert obs.dtype == chunks.dtype == torch.float32 and mask.dtype == torch.bool
    assert obs.flatten().tolist() == [0, 1, 2, 10, 11]
    assert chunks[..., 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [10, 11, 11], [11, 11, 11]]
    assert mask.int().tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0]]


def test_save_load_round_trip_is_exact(tmp_path):
    pi = _policy(act_low=(-1.0, -0.5), act_high=0.5)
    pi.set_normalization(torch.arange(5.0), torch.tensor([1.0, 2.0, 0.0, 4.0, 5.0]))
    assert pi.obs_std[2] == 1.0 and pi.cfg.obs_std[1] == 2.0  # constant feature -> std 1
    pi.save(tmp_path / "p")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    back = FlowChunkPolicy.load(tmp_path / "p")
    assert back.cfg == pi.cfg
    for (k, v), (k2, v2) in zip(pi.state_dict().items(), back.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    obs, _, noise, _ = _batch(5, pi)
    assert torch.equal(
        back.sample(obs, noise=noise, n_steps=3), pi.sample(obs, noise=noise, n_steps=3)
    )


# ------------------------------------------------------------------ controller


def _spied(pi):
    """Record ``(batch, n_steps)`` of every ``pi.sample`` call and the chunks it returned."""
    calls, chunks = [], []
    orig = pi.sample

    def sample(obs, n_steps=None, noise=None, generator=None):
        calls.append((obs.shape[0], n_steps))
        chunks.append(orig(obs, n_steps=n_steps, noise=noise, generator=generator))
        return chunks[-1]

    pi.sample = sample
    return calls, chunks


def test_controller_executes_then_resamples():
    pi = _policy(horizon=6)
    calls, chunks = _spied(pi)
    ctrl = ChunkController(pi, execute=4, n_steps=3, seed=0)
    obs = np.zeros(5, np.float32)
    acts = [ctrl(obs) for _ in range(10)]
    assert acts[0].shape == (2,) and calls == [(1, 3)] * 3  # steps 0, 4 and 8 resample
    for i, a in enumerate(acts):
        np.testing.assert_array_equal(a, chunks[i // 4][0, i % 4].numpy())
    ctrl.reset()
    ctrl(obs)
    assert len(calls) == 4
    with pytest.raises(ValueError):
        ChunkController(pi, execute=7)


def test_controller_batched_keeps_per_env_queues_and_resets_chosen_envs():
    pi = _policy(horizon=4)
    calls, _ = _spied(pi)
    ctrl = ChunkController(pi, execute=3, seed=1)
    obs = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    a0 = ctrl.act(obs)
    a1 = ctrl.act(obs)
    assert a0.shape == (3, 2) and calls == [(3, None)]
    ctrl.reset([1])
    a2 = ctrl.act(obs)
    assert calls == [(3, None), (1, None)]  # only env 1 resampled
    plan = ctrl._plan
    np.testing.assert_array_equal(a2[[0, 2]], plan[[0, 2], 2])  # envs 0, 2 continue
    np.testing.assert_array_equal(a2[1], plan[1, 0])
    assert not np.array_equal(a1[[0, 2]], a2[[0, 2]])
    ctrl.act(obs)  # envs 0, 2 exhausted their 3 actions, env 1 has 2 left
    assert calls[-1] == (2, None)
    ctrl.reset()
    ctrl.act(obs)
    assert calls[-1] == (3, None)


# ------------------------------------------------------------------ BC behaviour


def _mode_stats(a: torch.Tensor) -> dict[str, float]:
    return {
        "near": float(((a.abs() - 1).abs() < 0.25).float().mean()),
        "mid": float((a.abs() < 0.5).float().mean()),
        "dist": float(torch.minimum((a - 1).abs(), (a + 1).abs()).mean()),
        "pos": float((a.mean(dim=(1, 2)) > 0).float().mean()),
    }


def test_bc_bimodal_flow_samples_both_modes_unlike_mse():
    g = torch.Generator().manual_seed(0)
    n, h = 4096, 4
    obs = torch.randn(n, 2, generator=g)
    sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    chunks = sign[:, None, None].expand(n, h, 1).clone()
    torch.manual_seed(0)
    pi = FlowChunkPolicy(FlowPolicyConfig(obs_dim=2, act_dim=1, horizon=h, hidden=128, n_blocks=2))
    losses = train_bc(pi, obs, chunks, None, steps=400, lr=2e-3, progress=False)
    assert np.mean(losses[-50:]) < np.mean(losses[:10])
    test_obs = torch.randn(1000, 2, generator=g)
    stats = {
        k: _mode_stats(pi.sample(test_obs, n_steps=k, generator=torch.Generator().manual_seed(1)))
        for k in (1, 3, 10)
    }
    s10 = stats[10]
    assert s10["near"] > 0.85 and s10["mid"] < 0.08 and 0.35 < s10["pos"] < 0.65
    # one Euler step lands on E[a | o] = 0: the mode-averaging of an MSE regressor
    assert stats[1]["mid"] > 0.8 and stats[1]["near"] < 0.05
    assert stats[1]["dist"] > stats[3]["dist"] > s10["dist"]
    # an MSE regressor on the same data predicts the mean of the modes
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.SiLU(), torch.nn.Linear(64, h))
    opt = torch.optim.Adam(mlp.parameters(), lr=3e-3)
    for _ in range(200):
        idx = torch.randint(n, (256,), generator=g)
        loss = (mlp(obs[idx]) - chunks[idx, :, 0]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert mlp(test_obs).abs().mean() < 0.25


def test_bc_conditioning_deterministic_target():
    g = torch.Generator().manual_seed(0)
    h = 4
    w = torch.randn(4, 2, generator=torch.Generator().manual_seed(3))
    k = torch.arange(h).float()[None, :, None]

    def f(o):
        return 0.8 * torch.sin((o @ w)[:, None, :] + 0.3 * k)

    obs = torch.rand(4096, 4, generator=g) * 2 - 1
    torch.manual_seed(0)
    pi = FlowChunkPolicy(FlowPolicyConfig(obs_dim=4, act_dim=2, horizon=h, hidden=128, n_blocks=2))
    train_bc(
        pi, obs, f(obs), torch.ones(4096, h, dtype=torch.bool), steps=400, lr=2e-3, progress=False
    )
    test_obs = torch.rand(1000, 4, generator=g) * 2 - 1
    mse = {
        n: float(
            (
                pi.sample(test_obs, n_steps=n, generator=torch.Generator().manual_seed(1))
                - f(test_obs)
            )
            .pow(2)
            .mean()
        )
        for n in (1, 3, 10)
    }
    var = float(f(test_obs).var())
    assert mse[10] < 0.03 * var  # < 3 % of the target variance (measured ~1 %)
    assert mse[1] < 0.25 * var  # one step is worse but still informative
