"""PAC-ACT (004-10): force-safety reward, ACT-transferred critic, hybrid behaviour prior."""

import dataclasses

import numpy as np
import pytest
import torch

from rlpost.robot.algos.pac_act import (
    PACACT,
    ActCritic,
    PACACTConfig,
    force_safety_rewards,
    run_pac_act,
    shaped_episodes,
)
from rlpost.robot.demos import collect_demos
from rlpost.robot.envs import TASKS
from rlpost.robot.policies.act import ActChunkPolicy, act_stats, train_act_bc
from rlpost.robot.policies.bc import make_chunks


@pytest.fixture(scope="module")
def contour_act():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = TASKS["contour"]
    demos = collect_demos("contour", n_good=3, n_poor=3, seed=0)
    pi = ActChunkPolicy(
        spec.obs_dim, spec.act_dim, spec.env_obs, horizon=4, stats=act_stats(demos, spec.env_obs)
    )
    obs, chunks, mask = make_chunks(demos, 4)
    train_act_bc(pi, obs, chunks, mask, steps=30, batch_size=32)
    return pi, demos, obs


def test_force_safety_rewards_hand_worked():
    r = force_safety_rewards(
        np.array([-0.1, -0.2, -0.3]),
        np.array([5.0, 8.0, 13.0]),
        threshold=8.0,
        nominal=5.0,
        excess_coef=0.5,
        violation_coef=0.1,
    )
    # only the 13 N step is above 8 N: -0.3 - 0.5 * 5/5 - 0.1
    np.testing.assert_allclose(r, [-0.1, -0.2, -0.9], atol=1e-6)


def test_shaped_episodes_use_the_recorded_forces(contour_act):
    _, demos, _ = contour_act
    cfg = PACACTConfig(force_excess_coef=1.0, force_violation_coef=0.0)
    ep = demos[-1]  # a poor demonstration: force spikes
    shaped = shaped_episodes([ep], "contour", cfg)[0]
    expect = ep.rewards - np.maximum(0, ep.contact_force - 8.0) / 5.0
    np.testing.assert_allclose(shaped.rewards, expect, atol=1e-5)
    assert (shaped.rewards < ep.rewards).any() and ep.rewards is not shaped.rewards
    with pytest.raises(ValueError, match="contact_force"):
        shaped_episodes([dataclasses.replace(ep, contact_force=None)], "contour", cfg)


def test_mean_chunk_is_the_deterministic_act_chunk(contour_act):
    pi, _, obs = contour_act
    mu = pi.mean_chunk(obs[:7])
    assert mu.requires_grad
    torch.testing.assert_close(mu.detach().clamp(-1, 1), pi.sample(obs[:7]), atol=1e-5, rtol=0)


def test_save_load_round_trip(contour_act, tmp_path):
    pi, _, obs = contour_act
    pi.save(tmp_path / "act")
    back = ActChunkPolicy.load(tmp_path / "act")
    torch.testing.assert_close(back.sample(obs[:5]), pi.sample(obs[:5]))
    (tmp_path / "flow").mkdir()
    (tmp_path / "flow" / "config.json").write_text('{"kind": "flow"}')
    with pytest.raises(ValueError, match="not a 'act'"):
        ActChunkPolicy.load(tmp_path / "flow")


def test_critic_is_transferred_from_the_act_encoder(contour_act):
    pi, _, obs = contour_act
    critic = ActCritic(pi, hidden=32)
    enc = dict(pi.act.model.encoder.named_parameters())
    for name, p in critic.encoder.named_parameters():
        torch.testing.assert_close(p, enc[name])
        assert p.data_ptr() != enc[name].data_ptr()  # a copy, trained separately
    # the latent token is what ACT feeds its encoder at inference (latent = 0)
    zero = pi.act.model.encoder_latent_input_proj(torch.zeros(1, 16))[0]
    torch.testing.assert_close(critic.latent_token, zero)
    chunks = pi.sample(obs[:6])
    q1, q2 = critic.q(pi.normalized_obs(obs[:6]), pi.normalize_actions(chunks))
    assert q1.shape == q2.shape == (6,)
    pi.act.zero_grad(set_to_none=True)  # (left over from behaviour cloning)
    q1.sum().backward()
    assert critic.encoder.layers[0].linear1.weight.grad.abs().sum() > 0
    assert pi.act.model.encoder.layers[0].linear1.weight.grad is None


def _drift(saved, obs, prior_coef: float, steps: int = 15) -> float:
    """Actor steps against a critic that pays for pushing every action up; returns the
    final anchor (normalised squared distance to the pretrained chunk)."""
    pi = ActChunkPolicy.load(saved)
    cfg = PACACTConfig(prior_coef=prior_coef, prior_mix=1.0, actor_lr=1e-3, hidden=16)
    learner = PACACT(pi, cfg)

    class _Up(torch.nn.Module):
        def q(self, nobs, nchunk):
            v = nchunk.flatten(1).sum(1)
            return v, v

    learner.critic = _Up()
    b = {"obs": obs[:64]}
    for _ in range(steps):
        learner.actor_step(b, None)
    return float(learner.prior_terms(obs[:64], None)["anchor"].detach())


def test_behaviour_prior_keeps_the_actor_near_the_pretrained_policy(contour_act, tmp_path):
    pi, _, obs = contour_act
    saved = pi.save(tmp_path / "act")
    free = _drift(saved, obs, prior_coef=0.0)
    held = _drift(saved, obs, prior_coef=50.0)
    assert free > 0.05, free  # the critic alone drags the actor away
    assert held < 0.25 * free, (held, free)


def test_anchor_is_zero_with_zero_gradient_at_the_pretrained_policy(contour_act):
    pi, _, obs = contour_act
    learner = PACACT(pi, PACACTConfig(hidden=16))
    terms = learner.prior_terms(obs[:16], None)
    # zero up to rounding: the frozen prior runs under no_grad, where PyTorch's
    # transformer layers may take their inference fast path (other kernels, ~1e-14 here)
    assert float(terms["anchor"].detach()) < 1e-10
    terms["anchor"].backward()
    grads = [p.grad for p in pi.act.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().max()) < 1e-6 for g in grads)
    pi.zero_grad(set_to_none=True)


def test_run_pac_act_smoke(contour_act, tmp_path):
    pi, demos, _ = contour_act
    pi = ActChunkPolicy.load(pi.save(tmp_path / "act"))
    cfg = PACACTConfig(
        episodes=4, envs=2, updates_per_round=4, critic_pretrain_steps=4, batch_size=16, hidden=16
    )
    rows = []
    out = run_pac_act(pi, "contour", demos, cfg, log=rows.append, progress=False)
    assert [r["episodes"] for r in out["history"]] == [2, 4] and rows == out["history"]
    for key in ("online_success", "peak_force", "frac_force_above", "q_loss", "anchor", "bc"):
        assert np.isfinite(rows[-1][key]), key
    assert rows[-1]["bc"] > 0  # the demonstration half of the hybrid constraint is active


def test_config_validation():
    with pytest.raises(ValueError, match="prior_mix"):
        PACACTConfig(prior_mix=1.5)
    with pytest.raises(ValueError, match="explore_std"):
        PACACTConfig(explore_std=-1)


def test_advantage_demo_weights_prefer_chunks_the_critic_values(contour_act):
    pi, _, obs = contour_act
    learner = PACACT(pi, PACACTConfig(hidden=16, demo_weighting="advantage", demo_beta=2.0))

    class _Down(torch.nn.Module):  # Q prefers small actions
        def q(self, nobs, nchunk):
            v = -nchunk.abs().flatten(1).sum(1)
            return v, v

    learner.target = _Down()
    chunks = torch.zeros(32, 4, 3)
    chunks[16:] = 0.8  # large actions: lower Q
    demo = {"obs": obs[:32], "chunks": chunks, "mask": torch.ones(32, 4, dtype=torch.bool)}
    w = learner.demo_weights(demo)
    assert abs(float(w.mean()) - 1.0) < 1e-5 and float(w.max()) <= 20.0 / float(w.mean()) + 1e-4
    assert float(w[:16].min()) > float(w[16:].max())
    # the weighted ACT loss with unit weights is the same two terms as lerobot's
    ones = torch.ones(32)
    torch.manual_seed(0)
    pi.act.train()
    weighted, _ = pi.loss(demo["obs"], chunks, demo["mask"], weights=ones)
    torch.manual_seed(0)
    plain, _ = pi.loss(demo["obs"], chunks, demo["mask"])
    pi.act.eval()
    torch.testing.assert_close(weighted, plain, rtol=1e-4, atol=1e-5)
