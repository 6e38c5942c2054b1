"""A cost-model simulator of adaptive tensor parallelism in the generation stage (PAT,
catalog 001-22). Real reconfiguration needs several GPUs; this is the decision logic and
its cost model, so the policy can be studied and tested anywhere.

The generation stage decodes a batch of requests whose response lengths are skewed: the
number still decoding, ``a(s)``, shrinks step by step until a few long responses remain.
``G`` GPUs run ``G / t`` engine replicas at tensor-parallel degree ``t``, each decoding
``ceil(a(s) / (G / t))`` requests a step (requests rebalanced across replicas). A decode
step costs, by a roofline :class:`TPProfile`,

    step(t, b) = max(W / (t * bw), b * F / (t * flops * eff(t))) + comm(t, b),

reading the weight shard or computing ``b`` tokens, whichever bounds it, plus the
tensor-parallel all-reduces (a latency per step and the rows' activations over the ring);
``eff(t) = 1 / (1 + kappa (t - 1))`` is the per-GPU compute efficiency lost to smaller
matrix shards. Low ``t`` wins while the batch is large (compute-bound, no all-reduce
traffic); high ``t`` wins in the tail (memory-bound: each step reads less weight per GPU).
The KV cache's reads are left out: per GPU they do not depend on ``t``.

:func:`simulate` runs a fixed degree or a policy. :func:`adaptive` is PAT's
predictor-guided reconfiguration: from predicted lengths (an offline profile of the
workload, or an oracle) :func:`plan_degrees` chooses when to switch and to which degree,
taking a switch only where the predicted saving exceeds its cost
(:meth:`TPProfile.reconfigure`). That cost is the weight reshard plus, for the unfinished
requests' KV cache, the cheaper of migrating it and recomputing it (the cost-model
choice of the paper).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TPProfile:
    """An engine's offline profile. Bytes, FLOPs and seconds; per GPU where it says."""

    weight_bytes: float  # the model's weights
    flops_per_token: float  # forward FLOPs of one decoded token (about 2 x parameters)
    kv_bytes_per_token: float  # KV cache of one token, all layers
    hbm_bandwidth: float  # bytes/s per GPU
    flops: float  # sustained FLOP/s per GPU
    link_bandwidth: float  # bytes/s per GPU between GPUs (weights and KV moved over it)
    allreduce_s: float  # latency of one decode step's all-reduces at t = 2 (x log2 t)
    allreduce_bytes_per_row: float = 0.0  # bytes one row all-reduces per step, all layers
    tp_efficiency_loss: float = 0.0  # kappa: compute runs at 1 / (1 + kappa (t - 1)) per GPU
    reconfig_fixed_s: float = 0.5  # fixed cost of a switch (new groups, graphs, launches)

    def step(self, t: int, batch: int) -> float:
        """Seconds of one decode step of a replica at degree ``t`` with ``batch`` rows."""
        if batch <= 0:
            return 0.0
        memory = self.weight_bytes / (t * self.hbm_bandwidth)
        eff = 1.0 / (1.0 + self.tp_efficiency_loss * (t - 1))
        compute = batch * self.flops_per_token / (t * self.flops * eff)
        comm = 0.0
        if t > 1:  # ring all-reduces: latency, and 2 (t - 1) / t of the rows' bytes
            ring = 2 * (t - 1) / t * batch * self.allreduce_bytes_per_row
            comm = self.allreduce_s * math.log2(t) + ring / self.link_bandwidth
        return max(memory, compute) + comm

    def reconfigure(self, t_from: int, t_to: int, kv_tokens: int, gpus: int) -> tuple[float, str]:
        """Seconds to switch the pool from degree ``t_from`` to ``t_to`` with ``kv_tokens``
        cached tokens in flight, and how their KV cache gets there (``migrate`` or
        ``recompute``)."""
        if t_from == t_to:
            return 0.0, "none"
        reshard = self.weight_bytes * abs(1 / t_from - 1 / t_to) / self.link_bandwidth
        kv = kv_tokens * self.kv_bytes_per_token
        migrate = kv / (gpus * self.link_bandwidth)
        recompute = kv_tokens * self.flops_per_token / (gpus * self.flops)
        how = "migrate" if migrate <= recompute else "recompute"
        return self.reconfig_fixed_s + reshard + min(migrate, recompute), how


@dataclass
class Plan:
    """A simulated generation stage: its seconds, and each switch ``(step, from, to, how)``."""

    seconds: float
    switches: list[tuple[int, int, int, str]] = field(default_factory=list)
    reconfig_seconds: float = 0.0


def active_counts(lengths: Sequence[int]) -> list[int]:
    """``a(s)``: requests still decoding at step ``s`` (``s = 0 .. max length - 1``)."""
    top = max(lengths, default=0)
    count = [0] * (top + 1)
    for n in lengths:
        count[n] += 1
    out, alive = [], len(lengths)
    for s in range(top):
        alive -= count[s]
        out.append(alive)
    return out


def remaining_seconds(profile: TPProfile, t: int, gpus: int, active: Sequence[int], start: int):
    """Seconds to decode steps ``start ..`` of ``active`` at degree ``t``."""
    replicas = gpus // t
    return sum(profile.step(t, math.ceil(a / replicas)) for a in active[start:])


def simulate(
    profile: TPProfile,
    lengths: Sequence[int],
    gpus: int,
    policy: int | Callable[[int, int, list[int]], int],
    prompt_tokens: int = 0,
) -> Plan:
    """Decode ``lengths`` on ``gpus`` GPUs. ``policy``: a fixed degree, or ``policy(step,
    degree, active) -> degree`` asked at every step (a change pays its reconfiguration)."""
    active = active_counts(lengths)
    t = policy if isinstance(policy, int) else policy(0, 0, active)
    _check(t, gpus)
    plan = Plan(0.0)
    for s, a in enumerate(active):
        if not isinstance(policy, int) and s > 0:
            new = policy(s, t, active)
            if new != t:
                _check(new, gpus)
                kv = sum(prompt_tokens + min(n, s) for n in lengths if n > s)
                cost, how = profile.reconfigure(t, new, kv, gpus)
                plan.seconds += cost
                plan.reconfig_seconds += cost
                plan.switches.append((s, t, new, how))
                t = new
        plan.seconds += profile.step(t, math.ceil(a / (gpus // t)))
    return plan


def _check(t: int, gpus: int) -> None:
    if t < 1 or gpus % t:
        raise ValueError(f"tensor-parallel degree {t} does not divide {gpus} GPUs")


def best_static(profile: TPProfile, lengths: Sequence[int], gpus: int, degrees: Sequence[int]):
    """``(degree, Plan)`` of the fastest fixed degree."""
    plans = {t: simulate(profile, lengths, gpus, t) for t in degrees}
    t = min(plans, key=lambda d: plans[d].seconds)
    return t, plans[t]


def plan_degrees(
    profile: TPProfile,
    gpus: int,
    degrees: Sequence[int],
    predicted: Sequence[int],
    every: int = 64,
    prompt_tokens: int = 0,
) -> list[int]:
    """The fastest degree for each window of ``every`` decode steps, switches included,
    for the ``predicted`` lengths: a dynamic programme over (window, degree) whose moves
    pay :meth:`TPProfile.reconfigure` (so a switch is taken only where the saving it buys
    exceeds its cost, and the best fixed degree is one of the plans it compares)."""
    for d in degrees:
        _check(d, gpus)
    pred = active_counts(predicted)
    windows = max(1, math.ceil(len(pred) / every))
    seg = [
        {
            d: remaining_seconds(profile, d, gpus, pred[k * every : (k + 1) * every], 0)
            for d in degrees
        }
        for k in range(windows)
    ]
    kv = [
        sum(prompt_tokens + min(n, k * every) for n in predicted if n > k * every)
        for k in range(windows)
    ]
    best = [dict(seg[0])]
    back: list[dict[int, int]] = [{}]
    for k in range(1, windows):
        row, arg = {}, {}
        for d in degrees:
            prev = min(
                degrees,
                key=lambda p: best[-1][p] + profile.reconfigure(p, d, kv[k], gpus)[0],
            )
            row[d] = best[-1][prev] + profile.reconfigure(prev, d, kv[k], gpus)[0] + seg[k][d]
            arg[d] = prev
        best.append(row)
        back.append(arg)
    d = min(degrees, key=lambda x: best[-1][x])
    plan = [d]
    for k in range(windows - 1, 0, -1):
        d = back[k][d]
        plan.append(d)
    return plan[::-1]


def adaptive(
    profile: TPProfile,
    gpus: int,
    degrees: Sequence[int],
    predicted: Sequence[int],
    every: int = 64,
    prompt_tokens: int = 0,
) -> Callable[[int, int, list[int]], int]:
    """PAT's predictor-guided policy for :func:`simulate`: the :func:`plan_degrees` plan
    of the ``predicted`` lengths, a degree per window of ``every`` steps."""
    plan = plan_degrees(profile, gpus, degrees, predicted, every, prompt_tokens)

    def policy(step: int, t: int, active: list[int]) -> int:
        return plan[min(step // every, len(plan) - 1)]

    return policy


__all__ = [
    "Plan",
    "TPProfile",
    "active_counts",
    "adaptive",
    "best_static",
    "plan_degrees",
    "remaining_seconds",
    "simulate",
]
