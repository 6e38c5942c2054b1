"""Advantages that pool information across the prompts of a batch through embeddings:
BASIS (000-02, prompt features) and GCPO (000-10, completion features)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    _metrics,
    broadcast,
    response_rewards,
)
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats, group_sum, masked_whiten


@dataclass(frozen=True)
class BASISParams:
    ridge: float | None = None  # lambda of the ridge regression; None: chosen by LOO error
    normalize_features: bool = True  # L2-normalise each feature row first
    whiten: bool = False  # additionally batch-whiten the advantages (REINFORCE++-style)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.ridge is not None and self.ridge <= 0:
            raise ValueError(f"ridge must be > 0 (or None for automatic), got {self.ridge}")


RIDGE_GRID = tuple(10.0**e for e in range(-3, 7))  # 1e-3 .. 1e6 (1e6 ~ the batch mean)


def loo_ridge_values(
    rewards: Tensor, features: Tensor | None, ridge: float | None
) -> tuple[Tensor, float]:
    """Leave-one-out ridge predictions ``[B]`` of each reward from the *other* prompts.

    Kernel form: X = [c 1, F] (an intercept column with c = 1e3, so the intercept is
    practically unpenalised), K = X X^T = V diag(s) V^T, hat matrix
    H = V diag(s / (s + lambda)) V^T, and the exact leave-one-out prediction
    (yhat_i - H_ii y_i) / (1 - H_ii). ``ridge=None`` picks lambda on :data:`RIDGE_GRID` by
    the mean squared leave-one-out error (one eigendecomposition, O(B^2) per lambda); a
    large lambda falls back to the leave-one-out batch mean when the features carry no
    signal. Without features it is the leave-one-out batch mean. Returns (values, lambda).
    """
    y = rewards.to(torch.float64)
    B = y.numel()
    if B < 2:
        return torch.zeros_like(rewards), float("nan")
    cols = [y.new_full((B, 1), 1e3)]
    if features is not None:
        cols.append(features.to(torch.float64))
    X = torch.cat(cols, 1)
    s, V = torch.linalg.eigh(X @ X.T)
    s = torch.where(s > 1e-12 * s.max(), s, torch.zeros_like(s))  # rounding-level -> 0
    Vy = V.T @ y
    best: tuple[float, Tensor, float] | None = None
    for lam in RIDGE_GRID if ridge is None else (ridge,):
        shrink = s / (s + lam)
        yhat = V @ (shrink * Vy)
        h = ((V**2) @ shrink).clamp(max=1 - 1e-9)
        loo = (yhat - h * y) / (1 - h)
        err = float(((loo - y) ** 2).mean())
        if best is None or err < best[0]:
            best = (err, loo, lam)
    assert best is not None
    return best[1].to(rewards.dtype), best[2]


@ADVANTAGES.register(
    "basis",
    BASISParams,
    needs={Input.PROMPT_FEATURES},
    coupling=Coupling.BATCH,
)
def basis(inp: AdvantageInput, p: BASISParams) -> AdvantageOutput:
    """BASIS: one rollout per prompt, a value baseline pooled across the batch (catalog 000-02).

    Critic-free: the value of prompt i is predicted from the *other* prompts of the batch
    by ridge regression of their rewards on prompt features (``prompt_features`` ``[B, D]``, e.g.
    the policy's mean-pooled prompt hidden state), evaluated leave-one-out so the baseline
    never sees r_i (the gradient stays unbiased; with ``ridge=None`` the one shared
    lambda is picked by the batch's leave-one-out error, a weak dependence we accept):

        V_i = LOO-ridge(r_{-i} ~ [1, f_{-i}])(f_i),      A_i = r_i - V_i

    Without features V_i is the leave-one-out batch mean (REINFORCE with a batch baseline).
    ``whiten`` additionally standardises A over the batch as REINFORCE++ does. The
    abstract states the aim (pool information across prompts with one rollout each); the
    leave-one-out ridge regression on prompt features is our reading. Metric
    ``value_fit_r2``: the fraction of reward variance the baseline explains.
    """
    r = response_rewards(inp)
    f = inp.prompt_features
    if f is not None and p.normalize_features:
        f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
    v, lam = loo_ridge_values(r, f, p.ridge)
    adv = r - v
    if p.whiten:
        adv = masked_whiten(adv, None, eps=p.eps)
    var = r.var(unbiased=False).clamp_min(1e-12)
    r2 = 1.0 - ((r - v) ** 2).mean() / var
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={**_metrics(adv, r), "value_fit_r2": r2.item(), "basis_ridge": lam},
    )


@dataclass(frozen=True)
class GCPOParams:
    w_min: float = 0.25  # clip range of the weights
    w_max: float = 4.0
    scale_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0 < self.w_min <= 1 <= self.w_max:
            raise ValueError(f"need 0 < w_min <= 1 <= w_max, got {self.w_min}, {self.w_max}")


def semantic_disagreement(features: Tensor, group_ids: Tensor | None) -> Tensor:
    """u_i = 1 - cos(e_i, mean direction of i's group), ``[B]`` in [0, 2].

    Geometry-aware uncertainty: it measures how far a response's embedding points from
    its group's consensus direction (unit vectors, so the embedding norm, the anisotropic
    part a token-entropy measure mixes in, plays no role).
    """
    e = features.float() / features.float().norm(dim=1, keepdim=True).clamp_min(1e-12)
    centre = group_sum(e, group_ids)  # [B, D]: sum of the unit vectors of i's group
    centre = centre / centre.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return 1.0 - (e * centre).sum(1)


@ADVANTAGES.register(
    "gcpo",
    GCPOParams,
    needs={Input.COMPLETION_FEATURES},
    coupling=Coupling.BATCH,
)
def gcpo(inp: AdvantageInput, p: GCPOParams) -> AdvantageOutput:
    """GCPO, geometry-aware calibrated uncertainty weighting of GRPO (catalog 000-10).

    1. Geometry-aware uncertainty u_i = :func:`semantic_disagreement` of the response
       embeddings (``features`` ``[B, D]``).
    2. Reward-based calibration: regress the learning-signal strength of each response's
       group (its reward std s_g) on u over the batch by least squares; the calibrated
       uncertainty is the prediction c_i = a + b u_i, i.e. uncertainty expressed as
       expected signal strength (b < 0 when disagreement turns out to mark noise).
    3. A_i = w_i A_i^GRPO with w_i = clip(c_i / mean(c), w_min, w_max), monotone in c.

    If u is constant over the batch, b = 0, c is constant and w = 1: exactly GRPO. The
    abstract names the ingredients (semantic disagreement, reward calibration, regulating
    gradient variance); the regression-based calibration and ratio weights are our reading.
    """
    if inp.completion_features is None:
        raise ValueError(
            "gcpo needs AdvantageInput.completion_features (response embeddings [B, D])"
        )
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    a = (r - s.mean) / (s.std + p.eps) if p.scale_by_std else r - s.mean  # GRPO
    u = semantic_disagreement(inp.completion_features, inp.group_ids).double()
    signal = s.std.double()
    du = u - u.mean()
    var_u = (du**2).mean()
    slope = torch.where(var_u > 1e-12, (du * (signal - signal.mean())).mean() / var_u, 0.0 * var_u)
    c = (signal.mean() + slope * du).clamp_min(1e-6)
    w = (c / c.mean()).clamp(p.w_min, p.w_max).float()
    adv = w * a
    return AdvantageOutput(
        broadcast(adv, inp.mask),
        metrics={
            **_metrics(adv, r),
            "gcpo_calibration_slope": float(slope),
            "gcpo_weight_min": w.min().item(),
            "gcpo_weight_max": w.max().item(),
        },
    )
