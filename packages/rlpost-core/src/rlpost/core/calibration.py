"""Staleness x learning-rate calibration (catalog 004-24).

Asynchronous GRPO trains on rollouts up to ``S - 1`` versions old, ``S`` being the
synchronization interval (the rollout weights are refreshed every ``S`` updates). The
paper's two empirical laws, from controlled sweeps of ``S`` and a constant learning rate
``eta``:

* **stability boundary**: the largest stable learning rate scales about as ``S^-1``, so
  the boundary is a near-constant product ``S * eta``;
* **collapse budget**: among runs that collapse, the collapse time scales about as
  ``eta^-1``, a cumulative learning-rate budget ``eta * t_collapse`` that is about the same
  across ``S``.

Its calibration rule: estimate both from a coarse sweep, then pick ``S`` and ``eta`` for the
intended horizon. This module is the fitting; ``tools/calibrate_staleness.py`` runs the
sweep with the LLM trainer.

:func:`stability_boundary` brackets each interval's threshold between its largest stable
and its smallest collapsing learning rate (their geometric mean), then fits
``log eta* = log c - b log S`` by least squares: ``b`` near 1 is the paper's law, and
``c`` is the boundary's ``S * eta`` product. :func:`collapse_budget` is the median of
``eta * t`` over the collapsed runs, with its spread. :func:`recommend` is the largest
learning rate on the sweep's grid below both limits, with a safety margin.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: ``interval`` (S), ``lr`` (eta), whether it collapsed and, if
    so, at which update (``collapse_step``)."""

    interval: int
    lr: float
    collapsed: bool
    collapse_step: float | None = None

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"sweep run: interval must be >= 1, got {self.interval}")
        if not self.lr > 0:
            raise ValueError(f"sweep run: lr must be > 0, got {self.lr}")
        if self.collapsed and (self.collapse_step is None or self.collapse_step <= 0):
            raise ValueError("sweep run: a collapsed run needs its collapse_step (> 0)")


@dataclass(frozen=True)
class Boundary:
    """The fitted stability boundary ``eta*(S) = c * S^-exponent``; ``thresholds``: each
    interval's bracketed threshold, ``(S, eta*, censored)``, censored when the interval
    had no collapsing run (``eta*`` is then its largest stable rate, a lower bound) or no
    stable one (its smallest collapsing rate, an upper bound)."""

    c: float
    exponent: float
    thresholds: tuple[tuple[int, float, bool], ...]

    def threshold(self, interval: int) -> float:
        return self.c * interval ** (-self.exponent)

    def products(self) -> list[float]:
        """``S * eta*`` per interval: constant under the paper's law."""
        return [s * eta for s, eta, _ in self.thresholds]


def _group(runs: Iterable[SweepRun]) -> dict[int, list[SweepRun]]:
    out: dict[int, list[SweepRun]] = {}
    for r in runs:
        out.setdefault(r.interval, []).append(r)
    return dict(sorted(out.items()))


def stability_boundary(runs: Sequence[SweepRun]) -> Boundary:
    """Each interval's threshold, bracketed, and the least-squares fit of
    ``log eta* = log c - exponent * log S`` (see the module docstring). Needs two or more
    intervals."""
    by = _group(runs)
    if len(by) < 2:
        raise ValueError(f"stability boundary: need runs at two or more intervals, got {list(by)}")
    th: list[tuple[int, float, bool]] = []
    for s, rs in by.items():
        stable = [r.lr for r in rs if not r.collapsed]
        broke = [r.lr for r in rs if r.collapsed]
        lo = max(stable) if stable else None
        hi = min((x for x in broke if lo is None or x > lo), default=None)
        if lo is not None and hi is not None:
            th.append((s, math.sqrt(lo * hi), False))
        else:  # one side of the bracket is missing: a censored estimate
            th.append((s, lo if lo is not None else min(broke), True))
    xs = [math.log(s) for s, _, _ in th]
    ys = [math.log(eta) for _, eta, _ in th]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return Boundary(math.exp(my - slope * mx), -slope, tuple(th))


@dataclass(frozen=True)
class Budget:
    """``eta * t_collapse`` over the collapsed runs: ``median``, ``spread`` (max / min)
    and ``per_interval`` medians."""

    median: float
    spread: float
    per_interval: dict[int, float]


def collapse_budget(runs: Sequence[SweepRun]) -> Budget:
    """The cumulative learning rate at collapse (see the module docstring)."""
    broke = [r for r in runs if r.collapsed]
    if not broke:
        raise ValueError("collapse budget: no run of the sweep collapsed")
    vals = [r.lr * float(r.collapse_step) for r in broke]  # type: ignore[arg-type]
    per = {
        s: statistics.median(r.lr * float(r.collapse_step) for r in rs)  # type: ignore[arg-type]
        for s, rs in _group(broke).items()
    }
    return Budget(statistics.median(vals), max(vals) / min(vals), per)


def recommend(
    boundary: Boundary,
    budget: Budget | None,
    interval: int,
    horizon: int,
    grid: Sequence[float],
    margin: float = 0.5,
) -> float | None:
    """The largest ``eta`` of ``grid`` below ``margin`` x the boundary at ``interval``
    and, when a budget is known, whose cumulative learning rate over ``horizon`` updates
    stays below ``margin`` x the budget; ``None`` when no grid value qualifies."""
    if not 0 < margin <= 1:
        raise ValueError(f"recommend: margin must be in (0, 1], got {margin}")
    cap = margin * boundary.threshold(interval)
    if budget is not None:
        cap = min(cap, margin * budget.median / max(horizon, 1))
    ok = [eta for eta in grid if eta <= cap]
    return max(ok) if ok else None


__all__ = [
    "Boundary",
    "Budget",
    "SweepRun",
    "collapse_budget",
    "recommend",
    "stability_boundary",
]
