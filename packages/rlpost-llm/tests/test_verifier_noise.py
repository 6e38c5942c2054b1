"""Controlled verifier noise (000-07): the requested false-positive and false-negative
rates are what the training reward sees, the true verdict stays what is measured, and the
flips are seeded and resume exactly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlpost.core.pool import RewardResult
from rlpost.llm.config import load_config
from rlpost.llm.rollout.noise import VerifierNoise
from rlpost.llm.trainer import Trainer


def _result(correct: torch.Tensor, bonus: float = 0.25) -> RewardResult:
    """A verifier column (0 / 1) and a second function scoring ``bonus`` everywhere."""
    comps = torch.stack([correct.float(), torch.full_like(correct.float(), bonus)], 1)
    return RewardResult(comps.sum(1), comps, ["correct", "format"], {"reward/mean": 0.0})


@pytest.mark.parametrize(("fp", "fn"), [(0.1, 0.3), (0.3, 0.0), (0.0, 0.1)])
def test_injected_rates_match_the_request_within_sampling_error(fp, fn):
    n = 40_000
    correct = torch.rand(n, generator=torch.Generator().manual_seed(0)) < 0.4
    res = _result(correct)
    noise = VerifierNoise(SimpleNamespace(false_positive=fp, false_negative=fn, seed=3), 0, 1.0)
    out = noise.apply(res)
    seen = out.rewards - 0.25  # the verifier's verdict as the training reward sees it
    assert set(seen.unique().tolist()) <= {0.0, 1.0}
    pos, neg = int(correct.sum()), int((~correct).sum())
    got_fp = float(((seen == 1) & ~correct).sum()) / neg
    got_fn = float(((seen == 0) & correct).sum()) / pos
    for got, want, m in ((got_fp, fp, neg), (got_fn, fn, pos)):  # 4 binomial sigmas
        assert abs(got - want) <= 4 * (want * (1 - want) / m) ** 0.5 + 1e-12
    assert out.metrics["noise/false_positive"] == pytest.approx(got_fp)
    assert out.metrics["noise/false_negative"] == pytest.approx(got_fn)
    assert torch.equal(out.components, res.components)  # the true verdict is kept
    assert out.metrics["reward/clean_mean"] == pytest.approx(float(res.rewards.mean()))


def test_the_flips_are_seeded_and_follow_the_checkpointed_generator():
    correct = torch.arange(1000) % 3 == 0
    cfg = SimpleNamespace(false_positive=0.2, false_negative=0.2, seed=7)
    a, b = VerifierNoise(cfg, 0, 2.0), VerifierNoise(cfg, 0, 2.0)
    assert torch.equal(a.apply(_result(correct)).rewards, b.apply(_result(correct)).rewards)
    saved = a.state_dict()
    next_a = a.apply(_result(correct)).rewards
    c = VerifierNoise(SimpleNamespace(false_positive=0.2, false_negative=0.2, seed=99), 0, 2.0)
    c.load_state_dict(saved)
    assert torch.equal(c.apply(_result(correct)).rewards, next_a)
    flipped = (next_a - _result(correct).rewards).abs()
    assert set(flipped.unique().tolist()) <= {0.0, 2.0}  # a flip moves the reward by the weight


def even(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def test_a_run_learns_from_the_noisy_reward_and_measures_the_true_one(fast_cfg):
    noisy = fast_cfg("reward.noise={false_negative: 0.6, false_positive: 0.3, seed: 1}",
                     "run.eval_every=2", "run.save_every=1")  # fmt: skip
    tr = Trainer(noisy, reward_fn=even)
    tr.train()
    rows = [json.loads(x) for x in (Path(noisy.run.dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "accuracy" in r]
    assert all("noise/false_negative" in r and "reward/clean_mean" in r for r in steps)
    assert any(r["reward/mean"] != r["reward/clean_mean"] for r in steps)
    assert all(r["reward/clean_mean"] == pytest.approx(r["accuracy"]) for r in steps)
    state = tr.scorer.noise.generator.get_state()
    resumed = Trainer(noisy, reward_fn=even, resume=True)
    assert torch.equal(resumed.scorer.noise.generator.get_state(), state)
    resumed.evaluate()  # measures the true verdict: it draws no flips
    assert torch.equal(resumed.scorer.noise.generator.get_state(), state)
    resumed.close()


def test_noise_on_an_environment_is_refused_in_one_line(fast_overrides):
    with pytest.raises(ValueError, match=r"data\.env episodes are scored by their environment"):
        load_config(None, [*fast_overrides, "data.env={name: rewrite}",
                           "reward.noise={false_negative: 0.1}"])  # fmt: skip
    with pytest.raises(ValueError, match="false_negative"):
        load_config(None, [*fast_overrides, "reward.noise={false_negative: 1.0}"])
