"""PAT's adaptive tensor parallelism (001-22) in the cost-model simulator: the roofline
step, the reconfiguration cost and its KV choice, and a predictor-guided policy that
switches only when the saving beats the overhead."""

import math
import random

import pytest

from rlpost.llm.tools.tpsim import (
    TPProfile,
    active_counts,
    adaptive,
    best_static,
    simulate,
)

GPU = dict(hbm_bandwidth=3.0e12, flops=4.0e14, link_bandwidth=4.0e11, allreduce_s=2.0e-4)
PROFILE = TPProfile(  # a 14B model on H100-class GPUs
    weight_bytes=28e9, flops_per_token=28e9, kv_bytes_per_token=1.6e5,
    allreduce_bytes_per_row=8.2e5, tp_efficiency_loss=0.15, **GPU,
)  # fmt: skip


def test_the_roofline_step_by_hand():
    ring = lambda t, b: 2 * (t - 1) / t * b * 8.2e5 / 4e11  # noqa: E731
    # memory-bound: 28e9 / (2 * 3e12) = 4.667 ms, plus one all-reduce level and one row
    assert PROFILE.step(2, 1) == pytest.approx(28e9 / 6e12 + 2e-4 + ring(2, 1))
    # compute-bound at 1000 rows, at efficiency 1 / 1.15: 1000 * 28e9 * 1.15 / (2 * 4e14)
    assert PROFILE.step(2, 1000) == pytest.approx(1000 * 28e9 * 1.15 / 8e14 + 2e-4 + ring(2, 1000))
    assert PROFILE.step(1, 1) == pytest.approx(28e9 / 3e12)  # no all-reduce at t = 1
    assert PROFILE.step(4, 0) == 0.0


def test_reconfiguration_picks_the_cheaper_kv_path():
    cost, how = PROFILE.reconfigure(1, 8, kv_tokens=10_000, gpus=8)
    reshard = 28e9 * (1 - 1 / 8) / 4e11
    migrate = 10_000 * 1.6e5 / (8 * 4e11)
    recompute = 10_000 * 28e9 / (8 * 4e14)
    assert how == ("migrate" if migrate < recompute else "recompute")
    assert cost == pytest.approx(0.5 + reshard + min(migrate, recompute))
    slow_link = TPProfile(**{**PROFILE.__dict__, "link_bandwidth": 1e6})
    assert slow_link.reconfigure(1, 8, 10_000, 8)[1] == "recompute"
    assert PROFILE.reconfigure(4, 4, 10_000, 8) == (0.0, "none")


def test_active_counts():
    assert active_counts([1, 3, 3, 0]) == [3, 2, 2]


def _skewed(n: int = 2048, seed: int = 0) -> list[int]:
    rng = random.Random(seed)  # long-tailed response lengths (a lognormal, capped)
    return [min(16384, max(16, int(rng.lognormvariate(math.log(1500), 0.8)))) for _ in range(n)]


def test_with_an_exact_predictor_adaptive_never_loses_to_the_best_static_degree():
    lengths = _skewed()
    degrees = [1, 2, 4, 8]
    _, static = best_static(PROFILE, lengths, 8, degrees)
    plan = simulate(PROFILE, lengths, 8, adaptive(PROFILE, 8, degrees, lengths, 256))
    assert plan.seconds <= static.seconds + 1e-9  # a fixed degree is one of its plans
    # low parallelism (many replicas) for the large batch, then more for the tail
    path = [plan.switches[0][1]] + [to for _, _, to, _ in plan.switches]
    assert path == sorted(path) and path[0] < path[-1] == 8
    assert plan.seconds < 0.9 * static.seconds  # the tail pays for the switches here
    assert plan.reconfig_seconds > 0


def test_the_plan_is_optimal_over_its_windows():
    """Against brute force over every degree sequence of a short stage (3 windows)."""
    import itertools

    lengths = [3 * 64] * 4 + [2 * 64] * 60 + [64] * 400
    degrees = [1, 2, 8]
    best = min(
        simulate(PROFILE, lengths, 8, lambda s, t, a, seq=seq: seq[min(s // 64, 2)]).seconds
        for seq in itertools.product(degrees, repeat=3)
    )
    plan = simulate(PROFILE, lengths, 8, adaptive(PROFILE, 8, degrees, lengths, 64))
    assert plan.seconds == pytest.approx(best)


def test_no_skew_or_a_prohibitive_switch_means_no_reconfiguration():
    same = [2000] * 2048
    _, static = best_static(PROFILE, same, 8, [1, 2, 4, 8])
    plan = simulate(PROFILE, same, 8, adaptive(PROFILE, 8, [1, 2, 4, 8], same, 256))
    assert plan.switches == [] and plan.seconds == pytest.approx(static.seconds)
    costly = TPProfile(**{**PROFILE.__dict__, "reconfig_fixed_s": 1e6})
    lengths = _skewed()
    plan = simulate(costly, lengths, 8, adaptive(costly, 8, [1, 2, 4, 8], lengths, 256))
    assert plan.switches == []


def test_a_degree_must_divide_the_gpus():
    with pytest.raises(ValueError, match="does not divide"):
        simulate(PROFILE, [10, 20], 8, 3)
