"""CRAFT's closed loop (001-19): Gaussian chunk policy, counterfactual models, chunk GAE."""

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from rlpost.robot.algos.common import evaluate_policy
from rlpost.robot.algos.craft import (
    PROXIES,
    CRAFTConfig,
    _collect,
    chunk_gae,
    gaussian_asymmetric_kl,
    kinematic_proxy_multimodal_reach,
    run_craft,
)
from rlpost.robot.demos import collect_demos
from rlpost.robot.policies.bc import make_chunks
from rlpost.robot.policies.gaussian import GaussianChunkPolicy, train_gaussian_bc


@pytest.fixture(scope="module")
def bc_policy():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    demos = collect_demos("multimodal_reach", n_good=10, n_poor=0, seed=0)
    pi = GaussianChunkPolicy(8, 2, horizon=4, hidden=64)
    obs, chunks, mask = make_chunks(demos, 4)
    losses = train_gaussian_bc(pi, obs, chunks, mask, steps=300, batch_size=128)
    assert np.mean(losses[-20:]) < 0.3 * np.mean(losses[:20])
    return pi


def test_log_prob_matches_torch_normal(bc_policy):
    pi = bc_policy
    obs = torch.randn(5, 8)
    chunks = torch.randn(5, 3, 4, 2)
    mu, std = pi.mean(obs), pi.log_std.exp()
    expect = Normal(mu[:, None], std).log_prob(chunks).flatten(2).sum(-1)
    torch.testing.assert_close(pi.log_prob(obs, chunks), expect)
    torch.testing.assert_close(pi.log_prob(obs, chunks[:, 0]), expect[:, 0])


def test_gaussian_asymmetric_kl_matches_torch():
    g = torch.Generator().manual_seed(0)
    ms, mt = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    ls, lt = 0.3 * torch.randn(6, 4, generator=g), 0.3 * torch.randn(6, 4, generator=g)
    s, t = Normal(ms, ls.exp()), Normal(mt, lt.exp())
    fwd = kl_divergence(t, s).sum(-1).mean()
    rev = kl_divergence(s, t).sum(-1).mean()
    torch.testing.assert_close(gaussian_asymmetric_kl(ms, ls, mt, lt, 1.0, 0.0), fwd)
    torch.testing.assert_close(
        gaussian_asymmetric_kl(ms, ls, mt, lt, 0.3, 2.0), 0.3 * fwd + 2 * rev
    )


def test_kinematic_proxy_hand_worked():
    obs = np.array([[0.0, 0.0, 0, 0, 0.4, 0.0, -0.4, 0.0]])
    toward = np.ones((1, 1, 4, 2)) * np.array([1.0, 0.0])  # 1 m/s towards goal 0
    still = np.zeros((1, 1, 4, 2))
    s = kinematic_proxy_multimodal_reach(obs, np.concatenate([toward, still], 1))
    # positions 0.04, 0.08, 0.12, 0.16 -> distances 0.36 + 0.32 + 0.28 + 0.24 = 1.2
    np.testing.assert_allclose(s[0], [-1.2, -1.6], atol=1e-9)
    # a miscalibrated model rotates the goals: "toward" no longer scores as well
    bad = PROXIES["multimodal_reach"]["miscalibrated"](obs, toward)
    assert bad[0, 0] < s[0, 0]


def test_chunk_gae_reduces_to_returns_and_td(bc_policy):
    cfg = CRAFTConfig(envs=3, group=2, gamma=0.9)
    b, finals = _collect(bc_policy, "multimodal_reach", 3, 0, cfg, torch.Generator().manual_seed(0))
    m = len(b["returns"])
    assert b["cands"].shape == (m, 2, 4, 2) and b["scores"].shape == (m, 2) and len(finals) == 3
    zeros = torch.zeros(m)
    # lambda = 1, V = 0: GAE is the Monte-Carlo return-to-go
    torch.testing.assert_close(chunk_gae(b, zeros, zeros, 1.0), b["returns"])
    # lambda = 0: the one-chunk TD error
    v = torch.randn(m)
    vf = torch.randn(m)
    a0 = chunk_gae(b, v, vf, 0.0)
    nxt = b["next"]
    v_next = torch.where(nxt >= 0, v[nxt.clamp_min(0)], vf)
    torch.testing.assert_close(a0, b["chunk_reward"] + b["discount"] * v_next - v)
    # every episode has exactly one last decision
    assert int((nxt < 0).sum()) == 3


def test_run_craft_smoke_and_errors(bc_policy):
    import copy

    pi = copy.deepcopy(bc_policy)
    cfg = CRAFTConfig(episodes=8, envs=4, group=4, updates_per_round=2, value_steps=5)
    rows = []
    out = run_craft(pi, "multimodal_reach", cfg, log=rows.append, progress=False)
    assert [r["episodes"] for r in out["history"]] == [4, 8]
    for k in ("online_success", "surrogate", "kl", "proxy_scale", "proxy_real_corr"):
        assert np.isfinite(rows[-1][k]), k
    assert any(
        not torch.equal(a, b) for a, b in zip(pi.parameters(), bc_policy.parameters(), strict=True)
    )
    ev = evaluate_policy(pi, "multimodal_reach", episodes=4, n_steps=1, seed=5)
    assert 0 <= ev["success"] <= 1
    with pytest.raises(ValueError, match="counterfactual model"):
        run_craft(pi, "contour", CRAFTConfig(episodes=1), progress=False)
    with pytest.raises(ValueError, match="mode"):
        CRAFTConfig(mode="nope")


def test_gaussian_save_load(bc_policy, tmp_path):
    bc_policy.save(tmp_path / "g")
    back = GaussianChunkPolicy.load(tmp_path / "g")
    obs = torch.randn(3, 8)
    torch.testing.assert_close(back.sample(obs), bc_policy.sample(obs))
