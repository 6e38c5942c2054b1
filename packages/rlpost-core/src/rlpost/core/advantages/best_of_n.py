"""Best-of-N-oriented advantages from m << N rollouts: TEA and Prefix-TEA (catalog 001-02).

Deployment returns the best of ``N`` samples, so the objective is the expected maximum
J_N = E[max(r_1, ..., r_N)]. Its score-function gradient is

    grad J_N = N * E_y[ grad log pi(y) * g_N(r(y)) ],
    g_N(r)   = E[max(r, M_{N-1})] = r + int_r^inf (1 - F(t)^(N-1)) dt,

with M_{N-1} the maximum of N - 1 independent rewards and F the reward CDF of the prompt.
Training sees only ``m`` rewards per prompt, too few to read F's upper tail at level
1 - 1/N directly. Both estimators below give a per-response advantage
A_i = g_N(r_i) - mean_group g_N, up to a positive per-group scale:

* ``tea`` (direct): the structural assumption is a location-scale tail; F is taken as
  Gaussian with the group's mean and std, so g_N(r) = mu + sigma * h_N((r - mu) / sigma)
  with h_N(z) = z + int_z^inf (1 - Phi(s)^(N-1)) ds tabulated once per N.
* ``prefix_tea`` (debiased): for N <= m the exact unbiased U-statistic

      U_N(i) = mean over (N-1)-subsets S of the other m-1 rewards of max(r_i, max S),

  and for N > m the Gaussian tail fitted, for each response, to the *other* responses'
  moments with the first-order predictive correction of the scale (see
  :func:`prefix_tea`), so a response's own reward never enters the statistics it is
  judged by.

The abstract fixes the objective (best-of-N with m << N rollouts, upper-tail
extrapolation, a direct and a fixed-order debiased estimator "based on moment
cancellation"); the Gaussian tail of TEA and the leave-one-out, first-order predictive
debiasing of Prefix-TEA are our readings of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    broadcast,
    group_normalize,
    response_rewards,
)
from rlpost.core.contract import Coupling
from rlpost.core.masked import group_stats, group_sum


@lru_cache(maxsize=32)
def _h_table(
    n: int, lo: float = -8.0, hi: float = 8.0, points: int = 4001
) -> tuple[Tensor, Tensor]:
    """Grid z and h_N(z) = z + int_z^hi (1 - Phi(s)^(N-1)) ds for a standard normal tail."""
    z = torch.linspace(lo, hi, points, dtype=torch.float64, device="cpu")
    phi = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    integrand = 1.0 - phi ** (n - 1)
    dz = z[1] - z[0]
    seg = 0.5 * (integrand[1:] + integrand[:-1]) * dz  # trapezoid on each cell
    tail = torch.cat([seg.flip(0).cumsum(0).flip(0), z.new_zeros(1)])
    return z, z + tail


def gaussian_best_of_n_gain(z: Tensor, n: int) -> Tensor:
    """h_N(z) = E[max(z, M_{N-1})] for standard normal draws, by table interpolation.

    Outside the grid [-8, 8]: h_N(z) = h_N(-8) below (the maximum of the others dominates)
    and z above. ``n = 1`` gives h(z) = z exactly, for every z. The table is built once
    on the CPU and moved to ``z``'s device.
    """
    if int(n) == 1:
        return z.clone()
    grid, h = (t.to(z.device) for t in _h_table(int(n)))
    zc = (
        z.to(torch.float64).nan_to_num(neginf=float(grid[0])).clamp(float(grid[0]), float(grid[-1]))
    )
    pos = (zc - grid[0]) / (grid[1] - grid[0])
    i0 = pos.floor().long().clamp(0, grid.numel() - 2)
    frac = pos - i0
    out = h[i0] * (1 - frac) + h[i0 + 1] * frac
    out = torch.where(z.to(torch.float64) > grid[-1], z.to(torch.float64), out)
    return out.to(z.dtype)


def _group_matrix(r: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Rewards laid out ``[G, m_max]`` (NaN padding), each row's slot and the group sizes."""
    G = int(index.max()) + 1
    counts = index.new_zeros(G).index_add_(0, index, torch.ones_like(index))
    order = torch.argsort(index, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(index)
    slot[order] = torch.arange(index.numel(), device=index.device) - starts[index[order]]
    table = torch.full(
        (G, int(counts.max())), float("nan"), dtype=torch.float64, device=index.device
    )
    table[index, slot] = r.to(torch.float64)
    return table, slot, counts


def best_of_k_ustat(r: Tensor, group_ids: Tensor | None, k: int) -> Tensor:
    """Unbiased U_k(i) = E[max(r_i, max of k-1 other rewards of i's group)], ``[B]``.

    Averaged over all (k-1)-subsets of the other m-1 rewards, in closed form: with the
    others sorted ascending s_1 <= ... <= s_{m-1}, the subset maximum is s_j with
    probability C(j-1, k-2) / C(m-1, k-1). k = 1 gives r_i; k > m raises.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    index = group_stats(r.float(), group_ids).index
    table, slot, counts = _group_matrix(r, index)
    if k > int(counts.min()):
        raise ValueError(
            f"best-of-{k} needs at least {k} rewards per group, got {int(counts.min())}"
        )
    if k == 1:
        return r.clone()
    m = table.shape[1]
    # others of each response: its group's row without its own slot -> [B, m-1]
    rows = table[index]  # [B, m]
    keep = torch.ones_like(rows, dtype=torch.bool)
    keep[torch.arange(r.numel(), device=r.device), slot] = False
    others = rows[keep].view(r.numel(), m - 1)
    others = torch.where(torch.isnan(others), torch.full_like(others, -math.inf), others)
    s = others.sort(1).values  # NaN pads (-inf) first
    n_other = (counts[index] - 1).to(torch.float64)  # [B]
    pad = (m - 1) - n_other  # number of -inf pads at the front of each row
    j = torch.arange(1, m, dtype=torch.float64, device=r.device)[None, :] - pad[:, None]
    # j: rank among the real others; log C(j-1, k-2) - log C(n_other, k-1)
    log_w = (
        torch.lgamma(j.clamp_min(1))  # log (j-1)!
        - torch.lgamma((j - k + 2).clamp_min(1))
        - math.lgamma(k - 1)
        - (torch.lgamma(n_other + 1) - math.lgamma(k) - torch.lgamma(n_other - k + 2))[:, None]
    )
    valid = j >= k - 1  # C(j-1, k-2) = 0 below
    w = torch.where(valid, log_w.exp(), torch.zeros_like(log_w))
    val = torch.maximum(r.to(torch.float64)[:, None], s)
    return (w * torch.where(valid, val, torch.zeros_like(val))).sum(1).to(r.dtype)


@dataclass(frozen=True)
class TEAParams:
    """Parameters of ``tea`` and ``prefix_tea`` (one class: the two share them)."""

    n: int = 16  # deployment best-of-N
    scale_by_std: bool = False  # True: divide by the group std of g_N (GRPO-style)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n (best-of-N at deployment) must be >= 1, got {self.n}")


PrefixTEAParams = TEAParams  # backward-compatible name


def _metrics(adv: Tensor, r: Tensor) -> dict[str, float]:
    return {"reward_mean": r.mean().item(), "adv_abs_mean": adv.abs().mean().item()}


@ADVANTAGES.register("tea", TEAParams, coupling=Coupling.GROUP)
def tea(inp: AdvantageInput, p: TEAParams) -> AdvantageOutput:
    """TEA, tail-extrapolated advantage (catalog 001-02; equations in the module docstring).

    A_i = sigma_g * h_N((r_i - mu_g) / sigma_g) - mean_g(...),  mu_g, sigma_g the group's
    reward mean and (unbiased) std. n = 1 reduces to r_i - mean_g(r) (Dr. GRPO); equal
    rewards give 0.
    """
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    sigma = s.std
    z = torch.where(sigma > 0, (r - s.mean) / sigma.clamp_min(1e-12), torch.zeros_like(r))
    g = torch.where(sigma > 0, sigma * gaussian_best_of_n_gain(z, p.n), torch.zeros_like(r))
    adv = group_normalize(g, inp.group_ids, p.scale_by_std, p.eps)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@ADVANTAGES.register("prefix_tea", TEAParams, coupling=Coupling.GROUP)
def prefix_tea(inp: AdvantageInput, p: TEAParams) -> AdvantageOutput:
    """Prefix-TEA, debiased tail extrapolation (catalog 001-02).

    * N <= m: the exact unbiased U-statistic g_i = U_N(i) (:func:`best_of_k_ustat`).
    * N > m: TEA's Gaussian tail, but each response is scored against the moments of the
      *other* m - 1 responses (mu_-i, s_-i), and the scale is the first-order predictive
      one, s_-i * sqrt(1 + 1/(m-1)):

          g_i = sigma_i * (h_N(z_i) - h_N(-inf)),   z_i = (r_i - mu_-i) / sigma_i,
          sigma_i = s_-i sqrt(1 + 1/(m - 1))

      i.e. E[(r_i - M_{N-1})^+] under the tail fitted to the others: g_N(r_i) minus
      mu_-i + sigma_i E[M_{N-1}], a baseline that depends on the others only (so it adds
      no bias) and removes the part of g_N that does not depend on r_i (its variance).
      Leaving r_i out cancels the correlation between a response's reward and the tail
      moments it is judged by (with its own sample in them, a high r_i inflates sigma and
      shrinks its own z); the predictive factor removes the first-order underestimate of
      the spread of a future draw from m - 1 samples.

      When the others all share one reward (s_-i = 0, e.g. the only success among binary
      rewards) the tail fitted to them is degenerate and would score r_i as 0; s_-i is
      then replaced by the full group std s_g (which includes r_i: the one spread the
      group shows), so a lone success gets the largest advantage of its group.

    A_i = g_i - mean_g(g); groups of equal rewards give 0. Needs >= 3 responses per group
    when N > m.
    """
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    m = int(s.count.min())
    if p.n <= m:
        g = best_of_k_ustat(r, inp.group_ids, p.n)
    else:
        if m < 3:
            raise ValueError(f"prefix_tea with n > group size needs >= 3 responses, got {m}")
        n = s.count.double()
        rc = r.double() - s.mean.double()  # centred first: the moments are shift-free
        mu = (group_sum(rc, inp.group_ids) - rc) / (n - 1)  # leave-one-out mean
        dev = rc - mu
        # leave-one-out sum of squares: sum_{j != i} r_j^2 - (n - 1) mu_-i^2
        ss = group_sum(rc**2, inp.group_ids) - rc**2 - (n - 1) * mu**2
        sd_loo = (ss.clamp_min(0) / (n - 2)).sqrt()
        sd_all = s.std.double()
        # rounding-level spread of the others counts as none: fall back to the group std
        sd = torch.where(sd_loo > 1e-6 * sd_all, sd_loo, sd_all) * (1 + 1 / (n - 1)).sqrt()
        z = torch.where(sd > 0, dev / sd.clamp_min(1e-12), torch.zeros_like(rc))
        floor = gaussian_best_of_n_gain(torch.full_like(z, -math.inf), p.n)  # E[M_{N-1}]
        g = (sd * (gaussian_best_of_n_gain(z, p.n) - floor)).to(r.dtype)
    adv = group_normalize(g, inp.group_ids, p.scale_by_std, p.eps)
    adv = torch.where(s.std > 0, adv, torch.zeros_like(adv))
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))
