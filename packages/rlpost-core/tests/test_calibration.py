"""The staleness x learning-rate calibration fit (004-24) on synthetic collapse data drawn
from the paper's two laws: a stability boundary S * eta = c and a collapse budget
eta * t = B."""

from __future__ import annotations

import math
import random

import pytest

from rlpost.core.calibration import (
    SweepRun,
    collapse_budget,
    recommend,
    stability_boundary,
)

GRID = [1e-4 * 2**k for k in range(10)]  # 1e-4 .. 5.1e-2, a factor of 2 apart


def _sweep(c: float, budget: float, intervals=(1, 2, 4, 8), noise: float = 0.0, seed: int = 0):
    """Runs of a synthetic sweep: eta above c / S collapses, at t = budget / eta (times
    a log-normal noise)."""
    rng = random.Random(seed)
    runs = []
    for s in intervals:
        for eta in GRID:
            if eta > c / s:
                t = budget / eta * math.exp(rng.gauss(0.0, noise))
                runs.append(SweepRun(s, eta, True, t))
            else:
                runs.append(SweepRun(s, eta, False))
    return runs


def test_the_fit_recovers_the_boundary_product_and_its_inverse_scaling():
    runs = _sweep(c=3e-3, budget=0.5)
    b = stability_boundary(runs)
    # brackets a factor of 2 wide: each threshold is within sqrt 2 of c / S
    for s, eta, censored in b.thresholds:
        assert not censored and 3e-3 / s / math.sqrt(2) <= eta <= 3e-3 / s * math.sqrt(2)
    assert b.exponent == pytest.approx(1.0, abs=0.15)
    assert b.c == pytest.approx(3e-3, rel=0.45)
    assert max(b.products()) / min(b.products()) <= 2.0 + 1e-9


def test_a_boundary_that_does_not_move_with_s_has_exponent_zero():
    runs = [SweepRun(s, r.lr, r.collapsed, r.collapse_step) for s in (1, 2, 4)
            for r in _sweep(c=3e-3, budget=0.5, intervals=(1,))]  # fmt: skip
    assert stability_boundary(runs).exponent == pytest.approx(0.0, abs=1e-9)


def test_the_collapse_budget_is_the_cumulative_learning_rate_at_collapse():
    exact = collapse_budget(_sweep(c=3e-3, budget=0.5))
    assert exact.median == pytest.approx(0.5) and exact.spread == pytest.approx(1.0)
    assert set(exact.per_interval) == {1, 2, 4, 8}
    noisy = collapse_budget(_sweep(c=3e-3, budget=0.5, noise=0.2, seed=3))
    assert noisy.median == pytest.approx(0.5, rel=0.2) and noisy.spread > 1.0


def test_the_recommendation_respects_both_limits():
    runs = _sweep(c=3e-3, budget=0.5)
    b, budget = stability_boundary(runs), collapse_budget(runs)
    eta = recommend(b, budget, interval=4, horizon=100, grid=GRID)
    assert eta is not None and eta <= 0.5 * b.threshold(4)
    assert eta * 100 <= 0.5 * budget.median
    # a long horizon is bound by the budget, a short one by the boundary
    long = recommend(b, budget, interval=1, horizon=1000, grid=GRID)
    short = recommend(b, budget, interval=1, horizon=10, grid=GRID)
    assert long is not None and short is not None and long < short
    assert recommend(b, budget, interval=1, horizon=10**9, grid=GRID) is None


def test_censored_intervals_and_bad_input():
    runs = [SweepRun(1, 1e-3, False), SweepRun(1, 2e-3, False), SweepRun(2, 1e-3, True, 50)]
    b = stability_boundary(runs)
    assert [(s, cens) for s, _, cens in b.thresholds] == [(1, True), (2, True)]
    with pytest.raises(ValueError, match="two or more intervals"):
        stability_boundary([SweepRun(1, 1e-3, False)])
    with pytest.raises(ValueError, match="no run of the sweep collapsed"):
        collapse_budget([SweepRun(1, 1e-3, False)])
    with pytest.raises(ValueError, match="collapse_step"):
        SweepRun(1, 1e-3, True)
    with pytest.raises(ValueError, match="interval"):
        SweepRun(0, 1e-3, False)
