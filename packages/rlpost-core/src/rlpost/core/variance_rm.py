"""Anchor-guided variance-aware reward modelling (catalog 000-28): a Gaussian reward
``R(y) ~ N(mu(y), sigma^2(y))`` per response, identified from pairwise preferences plus
two coarse anchor labels.

**The model.** A response's reward varies across the people judging it (pluralistic
preferences): ``R(y) ~ N(mu(y), sigma^2(y))``. A random judge prefers ``y1`` to ``y2`` with
probability

    P(y1 > y2) = Phi((mu1 - mu2) / sqrt(sigma1^2 + sigma2^2))        (a soft label)

Pairwise preferences alone cannot identify the Gaussian: ``(mu, sigma) -> (c mu + b, c
sigma)`` leaves every ``P(y1 > y2)`` unchanged, so the reward's scale, and with it the
variance, is free (and Bradley-Terry, ``P = sigmoid(r1 - r2)``, has no variance at all:
disagreement can only shrink its margins). **Two anchors** fix it: coarse response-level
labels "is ``R(y)`` above ``a_k``?" for two thresholds ``a_1 < a_2`` (say "acceptable",
"good"), with

    P(R(y) > a_k) = Phi((mu - a_k) / sigma),   k = 1, 2,

determine ``mu`` and ``sigma`` uniquely (:func:`identify_from_anchors`: two probit
equations in two unknowns). The joint objective (:func:`variance_aware_loss`) is the
soft-label cross-entropy of the pairwise probabilities plus ``anchor_weight`` x the
binary cross-entropy of the anchor probabilities.

Use: a reward of ``mu`` (risk-neutral) or ``mu - kappa sigma`` (risk-averse,
:func:`risk_adjusted`), and best-of-N selection by it (:func:`best_of_n`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "anchor_probability",
    "best_of_n",
    "bradley_terry_loss",
    "identify_from_anchors",
    "preference_probability",
    "risk_adjusted",
    "variance_aware_loss",
]

_EPS = 1e-6


def _phi(z: Tensor) -> Tensor:
    """The standard normal CDF."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2)))


def preference_probability(mu1: Tensor, var1: Tensor, mu2: Tensor, var2: Tensor) -> Tensor:
    """``P(y1 > y2) = Phi((mu1 - mu2) / sqrt(var1 + var2))``."""
    return _phi((mu1 - mu2) / torch.sqrt(var1 + var2 + _EPS))


def anchor_probability(mu: Tensor, var: Tensor, threshold: float | Tensor) -> Tensor:
    """``P(R(y) > threshold) = Phi((mu - threshold) / sigma)``."""
    return _phi((mu - threshold) / torch.sqrt(var + _EPS))


def _bce(p: Tensor, target: Tensor) -> Tensor:
    p = p.clamp(_EPS, 1 - _EPS)
    return -(target * p.log() + (1 - target) * (1 - p).log())


def variance_aware_loss(
    mu_a: Tensor,
    logvar_a: Tensor,
    mu_b: Tensor,
    logvar_b: Tensor,
    prefer_a: Tensor,
    anchor_mu: Tensor | None = None,
    anchor_logvar: Tensor | None = None,
    anchor_labels: Tensor | None = None,
    thresholds: tuple[float, float] = (0.0, 1.0),
    anchor_weight: float = 1.0,
) -> Tensor:
    """The joint objective: the pairwise soft-label cross-entropy (``prefer_a``: the share
    of judges preferring ``a``, or 0 / 1) plus ``anchor_weight`` x the anchors' binary
    cross-entropy (``anchor_labels [M, 2]``: above the first / second threshold, 0 / 1 or
    a share, for responses with ``anchor_mu`` / ``anchor_logvar [M]``). Means over items."""
    p = preference_probability(mu_a, logvar_a.exp(), mu_b, logvar_b.exp())
    loss = _bce(p, prefer_a.to(p.dtype)).mean()
    if anchor_labels is not None and anchor_mu is not None and anchor_logvar is not None:
        var = anchor_logvar.exp()
        probs = torch.stack([anchor_probability(anchor_mu, var, t) for t in thresholds], -1)
        loss = loss + anchor_weight * _bce(probs, anchor_labels.to(probs.dtype)).mean()
    return loss


def bradley_terry_loss(r_a: Tensor, r_b: Tensor, prefer_a: Tensor) -> Tensor:
    """Bradley-Terry's soft-label cross-entropy, ``P(a > b) = sigmoid(r_a - r_b)``."""
    return _bce(torch.sigmoid(r_a - r_b), prefer_a.to(r_a.dtype)).mean()


def identify_from_anchors(
    p1: Tensor, p2: Tensor, thresholds: tuple[float, float] = (0.0, 1.0)
) -> tuple[Tensor, Tensor]:
    """``(mu, sigma)`` from the two anchor probabilities ``P(R > a_1) = p1`` and
    ``P(R > a_2) = p2`` (``p1 > p2`` when ``a_1 < a_2``): ``(mu - a_k) / sigma =
    Phi^-1(p_k)`` solved for the two unknowns. The identification the abstract proves,
    in closed form."""
    a1, a2 = thresholds
    normal = torch.distributions.Normal(0.0, 1.0)
    z1, z2 = normal.icdf(p1), normal.icdf(p2)
    sigma = (a2 - a1) / (z1 - z2)
    return a1 + z1 * sigma, sigma


def risk_adjusted(mu: Tensor, var: Tensor, kappa: float = 0.0) -> Tensor:
    """``mu - kappa sigma``: the mean (``kappa = 0``) or a risk-averse reward."""
    return mu - kappa * torch.sqrt(var.clamp_min(0))


def best_of_n(mu: Tensor, var: Tensor, kappa: float = 0.0) -> Tensor:
    """Index of the best of each row's N candidates (``[B, N]``) by :func:`risk_adjusted`."""
    return risk_adjusted(mu, var, kappa).argmax(-1)
