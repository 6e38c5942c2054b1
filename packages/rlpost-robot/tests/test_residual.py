"""Offline residual RL correction of a base decoder's trajectories (catalog 004-03)."""

import pytest
import torch

from rlpost.robot.algos.residual import (
    ResidualRLConfig,
    pearson_r,
    rmse,
    synthetic_decoding_data,
    train_residual_rl,
    window_states,
)


def test_metrics_hand_worked():
    a = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [3.0, 0.0]]])
    b = torch.tensor([[[2.0, 0.0], [4.0, 1.0], [6.0, 0.0]]])
    assert torch.allclose(pearson_r(a, b), torch.ones(2))
    assert torch.allclose(pearson_r(a, -b), -torch.ones(2))
    assert torch.allclose(rmse(a, b), torch.tensor([(14 / 3) ** 0.5, 0.0]))


def test_window_states_are_causal_and_padded():
    pred = torch.arange(5, dtype=torch.float32).reshape(1, 5, 1)
    s = window_states(pred, window=3)
    assert s.shape == (1, 5, 4)
    # t = 0: window [p0, p0, p0] relative to p0 -> zeros, then p0
    assert s[0, 0].tolist() == [0.0, 0.0, 0.0, 0.0]
    # t = 3: window [p1, p2, p3] - p3 = [-2, -1, 0], then p3 = 3; never p4 (the future)
    assert s[0, 3].tolist() == [-2.0, -1.0, 0.0, 3.0]


def test_residual_rl_raises_correlation_and_lowers_rmse_on_held_out_trajectories():
    torch.set_num_threads(1)
    train, test = synthetic_decoding_data(32, 150, seed=0), synthetic_decoding_data(16, 150, seed=1)
    cfg = ResidualRLConfig(steps=800, batch_size=256, hidden=64)
    agent, log = train_residual_rl(train, cfg)
    corrected = agent.correct(test.pred)
    r0, r1 = pearson_r(test.pred, test.target), pearson_r(corrected, test.target)
    e0, e1 = rmse(test.pred, test.target), rmse(corrected, test.target)
    assert (r1 > r0 + 0.1).all(), (r0, r1)
    assert (e1 < 0.9 * e0).all(), (e0, e1)
    assert (corrected - test.pred).abs().max() <= cfg.max_delta + 1e-6  # bounded corrections
    assert log[-1]["reward"] > log[0]["reward"]


def test_data_is_seeded():
    a, b = synthetic_decoding_data(2, 10, seed=3), synthetic_decoding_data(2, 10, seed=3)
    assert torch.equal(a.pred, b.pred) and torch.equal(a.target, b.target)
    with pytest.raises(AssertionError):
        assert torch.equal(a.pred, synthetic_decoding_data(2, 10, seed=4).pred)


def test_agent_save_load_round_trip(tmp_path):
    from rlpost.robot.algos.residual import ResidualAgent, ResidualRLConfig

    data = synthetic_decoding_data(2, 30, seed=0)
    agent, _ = train_residual_rl(data, ResidualRLConfig(steps=3, hidden=8, batch_size=16))
    loaded = ResidualAgent.load(agent.save(tmp_path / "agent"))
    assert torch.equal(loaded.correct(data.pred), agent.correct(data.pred))
    assert sorted(p.name for p in (tmp_path / "agent").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
