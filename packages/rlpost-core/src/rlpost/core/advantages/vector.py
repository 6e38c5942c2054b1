"""Advantages of vector rewards ``[B, K]``: VPO (catalog 000-08) and RDPO (catalog 000-24).

Both consume the reward vector itself instead of the weighted sum
:func:`rlpost.core.advantages.scalarize_rewards` gives the scalar estimators.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    broadcast,
    group_normalize,
)
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats, group_sum


def _vector_rewards(inp: AdvantageInput, who: str) -> Tensor:
    if inp.rewards.dim() != 2:
        raise ValueError(f"{who} needs vector rewards [B, K], got {tuple(inp.rewards.shape)}")
    if inp.token_rewards is not None:
        raise ValueError(f"{who} takes no token_rewards: put in-reward penalties in a component")
    return inp.rewards.double()


def dirichlet_weights(
    k: int, n: int, concentration: float, seed: int, device: torch.device | str = "cpu"
) -> Tensor:
    """``[n, k]`` fixed draws of downstream trade-offs w ~ Dirichlet(concentration).

    Drawn on the CPU with a seeded generator (the same draws on every device), then moved
    to ``device``.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    alpha = torch.full((n, k), float(concentration), dtype=torch.float64, device="cpu")
    g = torch._standard_gamma(alpha, gen)
    return (g / g.sum(1, keepdim=True)).to(device)


@dataclass(frozen=True)
class VPOParams:
    n_weights: int = 1024  # Monte-Carlo draws of downstream reward functions w . r
    concentration: float = 1.0  # Dirichlet concentration (1 = uniform on the simplex)
    seed: int = 0
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.n_weights < 1 or self.concentration <= 0:
            raise ValueError(f"need n_weights >= 1 and concentration > 0, got {self}")


@ADVANTAGES.register("vpo", VPOParams, needs={Input.VECTOR_REWARDS}, coupling=Coupling.GROUP)
def vpo(inp: AdvantageInput, p: VPOParams) -> AdvantageOutput:
    """VPO, vector policy optimisation (catalog 000-08): a drop-in for GRPO's advantage.

    The group of n responses is treated as the *set* a test-time search selects from,
    under a downstream reward w . r that is unknown at training time (w drawn from a
    Dirichlet on the simplex of the K reward components). The set's value is

        V(S) = E_w[ max_{j in S} w . r_j ]

    and response i is credited with its marginal contribution to it,

        c_i = V(S) - V(S minus i) = E_w[ 1[i is the unique best under w] (w.r_i - second best) ],
        A_i = (c_i - mean_g c) / (std_g c + eps)

    so a response is rewarded for being the best trade-off for *some* downstream weights,
    which makes the responses of a group specialise instead of all converging on the best
    weighted sum. With K = 1 it credits the group's best response by its margin (a
    best-of-n objective). The set-value reading of "trains the LLM to output a set of
    solutions where individual solutions specialise to different trade-offs" is ours.
    """
    R = _vector_rewards(inp, "vpo")
    if inp.reward_mask is not None:
        R = torch.where(inp.reward_mask.bool(), R, torch.zeros_like(R))
    W = dirichlet_weights(R.shape[1], p.n_weights, p.concentration, p.seed, R.device)
    scores = R @ W.T  # [B, n_w]
    g = group_stats(R[:, 0], inp.group_ids).index
    G = int(g.max()) + 1
    idx = g[:, None].expand_as(scores)
    best = scores.new_full((G, p.n_weights), -torch.inf).scatter_reduce(
        0, idx, scores, reduce="amax"
    )
    is_best = scores == best[g]
    n_best = group_sum(is_best.to(scores.dtype), inp.group_ids)
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
    second = scores.new_full((G, p.n_weights), -torch.inf).scatter_reduce(
        0, idx, others, reduce="amax"
    )[g]
    unique_best = is_best & (n_best == 1) & torch.isfinite(second)
    contrib = torch.where(unique_best, scores - second, torch.zeros_like(scores)).mean(1)
    adv = group_normalize(contrib, inp.group_ids, p.scale_by_std, p.eps).float()
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={
            "reward_mean": R.sum(1).mean().item(),
            "adv_abs_mean": adv.abs().mean().item(),
            "vpo_set_value": float(best[torch.isfinite(best)].mean()) if G else 0.0,
        },
    )


@dataclass(frozen=True)
class RDPOParams:
    eps: float = 1e-6  # eigenvalue floor of the whitening (directions below it are dropped)
    normalize_by_active: bool = True  # divide the aggregate by sqrt(#active components)

    def __post_init__(self) -> None:
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")


def magnitude_aware_quantile(R: Tensor, active: Tensor, group_ids: Tensor | None) -> Tensor:
    """Step 1 of RDPO: per prompt group and component, ``[B, K]`` (0 where inactive).

    q_i = (#{j: r_j < r_i} + (#{j: r_j = r_i} - 1)/2 + 1/2) / n   (mid-rank quantile)
    x_i = (2 q_i - 1) * spread_g / scale_k

    over the group's active entries; spread_g = max - min of the group's values and
    scale_k = 1 for components whose active values all lie in [0, 1] (binary, fractional)
    else the component's range over the batch. The rank part puts binary, fractional and
    continuous rewards on one scale; the spread factor keeps the magnitude: a group whose
    scores differ by 0.01 gets small advantages, not +-1. For a binary component,
    x_i = r_i - mean_g(r) exactly.

    Cost: the comparisons are laid out over all pairs of the batch, ``[B, B, K]`` booleans
    and doubles (about 17 B^2 K bytes at peak: 36 MB for B = 512, K = 8), plus O(B^2 K)
    time; pairs from different groups are masked out rather than skipped. Fine for the
    rollout batches of one update step; split a larger batch by group before calling.
    """
    g = group_stats(R[:, 0].float(), group_ids).index
    same = (g[:, None] == g[None, :])[:, :, None] & active[None, :, :] & active[:, None, :]
    # [i, j, k]: j is an active peer of i for component k
    less = (same & (R[None, :, :] < R[:, None, :])).double().sum(1)
    equal = (same & (R[None, :, :] == R[:, None, :])).double().sum(1)
    n = same.double().sum(1)
    q = (less + 0.5 * equal) / n.clamp_min(1.0)
    big = torch.full((), torch.inf, dtype=R.dtype, device=R.device)
    hi = torch.where(same, R[None, :, :], -big).amax(1)
    lo = torch.where(same, R[None, :, :], big).amin(1)
    spread = torch.where(n > 0, hi - lo, torch.zeros_like(hi))
    Ra = torch.where(active, R, torch.full_like(R, torch.nan))
    unit = ((Ra >= 0) & (Ra <= 1) | ~active).all(0)
    rng = torch.nan_to_num(Ra, nan=-torch.inf).amax(0) - torch.nan_to_num(Ra, nan=torch.inf).amin(0)
    scale = torch.where(unit, torch.ones_like(rng), rng.clamp_min(1e-12))
    x = (2 * q - 1) * spread / scale
    return torch.where(active & (n > 1), x, torch.zeros_like(x))


def whiten_subspaces(X: Tensor, active: Tensor, eps: float) -> Tensor:
    """Step 2 of RDPO: ZCA (Mahalanobis) whitening within each active reward subspace.

    Rows sharing an activity pattern S form one subspace; their components in S get
    X_S Sigma_S^(-1/2), Sigma_S = X_S^T X_S / n (X is zero-mean per group by construction),
    so on each subspace the whitened components have identity second moment. Eigen
    directions with eigenvalue <= eps (constant or collinear components) are dropped.
    """
    out = torch.zeros_like(X)
    patterns, inverse = torch.unique(active, dim=0, return_inverse=True)
    for pi in range(patterns.shape[0]):  # one solve per distinct pattern (few), not per row
        cols = patterns[pi].nonzero().squeeze(1)
        rows = (inverse == pi).nonzero().squeeze(1)
        if cols.numel() == 0:
            continue
        Xs = X[rows][:, cols]
        cov = Xs.T @ Xs / rows.numel()
        evals, evecs = torch.linalg.eigh(cov)
        inv_sqrt = torch.where(evals > eps, evals.clamp_min(eps).rsqrt(), torch.zeros_like(evals))
        out[rows[:, None], cols[None, :]] = Xs @ (evecs * inv_sqrt) @ evecs.T
    return out


@ADVANTAGES.register(
    "rdpo",
    RDPOParams,
    needs={Input.VECTOR_REWARDS},
    coupling=Coupling.GROUP,
)
def rdpo(inp: AdvantageInput, p: RDPOParams) -> AdvantageOutput:
    """RDPO, reward-decorrelated policy optimisation (catalog 000-24).

    1. Magnitude-aware quantile normalisation (:func:`magnitude_aware_quantile`) of each
       reward component within its prompt group.
    2. Mahalanobis (ZCA) whitening within each active reward subspace
       (:func:`whiten_subspaces`): correlated components stop counting twice.
    3. Aggregation: A_i = sum_k w_k x_ik over i's active components (``reward_weights``,
       default 1), divided by sqrt(#active) when ``normalize_by_active``.

    ``reward_mask`` ``[B, K]`` marks which components apply to each response (multi-task
    batches); without it all are active. The quantile, spread and ZCA forms are our
    readings of the abstract's three named steps.
    """
    R = _vector_rewards(inp, "rdpo")
    active = (
        inp.reward_mask.bool()
        if inp.reward_mask is not None
        else torch.ones_like(R, dtype=torch.bool)
    )
    R = torch.where(active, R, torch.zeros_like(R))
    X = magnitude_aware_quantile(R, active, inp.group_ids)
    Z = whiten_subspaces(X, active, p.eps)
    w = inp.reward_weights.double() if inp.reward_weights is not None else R.new_ones(R.shape[1])
    adv = (Z * active) @ w
    if p.normalize_by_active:
        adv = adv / active.sum(1).clamp_min(1).double().sqrt()
    adv = adv.float()
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={"reward_mean": R.mean().item(), "adv_abs_mean": adv.abs().mean().item()},
    )
