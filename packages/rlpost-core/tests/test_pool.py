"""RewardPool limits added for every domain: memory cap, float32 range."""

import pytest

from rlpost.core.pool import RewardPool


def greedy(item, example):
    if item == "big":
        block = bytearray(2 << 30)  # 2 GiB: past the cap
        return float(len(block))
    return 1.0


def overflow(item, example):
    return 1e39 if item == "huge" else 0.5


def test_an_evaluation_past_the_memory_cap_is_counted_and_the_others_score():
    with RewardPool(greedy, workers=1, timeout_s=20, memory_mb=256) as pool:
        res = pool.score(["a", "big", "b", "c"], [None] * 4)
    assert res.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert res.metrics["reward/oom"] == 1 and res.metrics["reward/errors"] == 0
    assert res.failed[:, 0].tolist() == [False, True, False, False]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_beyond_float32_is_an_error_not_an_inf(workers):
    with RewardPool(overflow, workers=workers, timeout_s=20) as pool:
        res = pool.score(["huge", "x"], [None, None])
    assert res.rewards.tolist() == [0.0, 0.5]
    assert res.metrics["reward/errors"] == 1
    assert "infinite in float32" in pool.last_failures[0][3]


def test_memory_cap_must_be_positive():
    with pytest.raises(ValueError, match="memory_mb must be positive"):
        RewardPool(overflow, workers=0, memory_mb=0)
