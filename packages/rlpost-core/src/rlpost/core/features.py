"""A shared feature space for several models' activations, and how features change
between them (catalog 001-30's feature-level analysis of RL against SFT).

Models fine-tuned from the same base are compared in one dictionary of features: a top-k
sparse autoencoder (:class:`TopKSAE`) trained on the activations of all of them on the
same inputs, so feature ``f`` means the same direction ``d_f`` (a unit decoder row) in
each. On a shared set of tokens, feature ``f``'s activations in two models are the
columns ``a`` and ``b``, and (:func:`feature_change`):

* its frequency in each: the share of tokens where it fires (``> 0``);
* its drift, ``||a - b||^2 / (||a||^2 + ||b||^2)`` in ``[0, 1]`` (activations are
  non-negative): 0 when it fires alike, 1 when it fires on disjoint tokens or in one
  model only;
* new (fires on at least ``min_freq`` of the tokens in the second model and never in the
  first), lost (the reverse) and changed (drift above ``threshold``).

:func:`mediators` ranks features by how much more they fire in the tuned model on a set
of tokens (the paper's samples where RL succeeds and the base fails), and :func:`steer`
scales chosen features' contribution to a hidden state: ``h + (gamma - 1) sum_f a_f(h)
d_f`` (``gamma = 0`` disables them, ``gamma > 1`` amplifies them), the rest of ``h``
(the autoencoder's error included) untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


class TopKSAE(nn.Module):
    """A sparse autoencoder keeping the ``k`` largest of ``n`` ReLU features per row."""

    def __init__(self, d: int, n: int, k: int, seed: int = 0):
        super().__init__()
        if not 0 < k <= n:
            raise ValueError(f"need 0 < k <= n features, got k={k}, n={n}")
        g = torch.Generator().manual_seed(seed)
        dec = torch.randn(n, d, generator=g)
        self.k = k
        self.dec = nn.Parameter(dec / dec.norm(dim=1, keepdim=True))
        self.enc = nn.Parameter(self.dec.detach().T.clone())
        self.b_enc = nn.Parameter(torch.zeros(n))
        self.b_dec = nn.Parameter(torch.zeros(d))

    def encode(self, x: Tensor) -> Tensor:
        """``[N, n]`` non-negative activations, ``k`` nonzero at most per row."""
        pre = torch.relu((x - self.b_dec) @ self.enc + self.b_enc)
        top = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values)

    def decode(self, a: Tensor) -> Tensor:
        return a @ self.dec + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        a = self.encode(x)
        return self.decode(a), a


def train_sae(
    x: Tensor, n: int, k: int, steps: int = 2000, lr: float = 1e-3, batch: int = 512,
    seed: int = 0,
) -> tuple[TopKSAE, float]:  # fmt: skip
    """A :class:`TopKSAE` fitted to the rows of ``x`` ``[N, d]`` (mean squared
    reconstruction error, decoder rows kept unit-norm); and the share of ``x``'s variance
    it leaves unexplained on all of ``x``."""
    x = x.detach().float()
    sae = TopKSAE(x.shape[1], n, k, seed)
    with torch.no_grad():
        sae.b_dec.copy_(x.mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        xb = x[torch.randint(0, x.shape[0], (min(batch, x.shape[0]),), generator=g)]
        loss = (sae(xb)[0] - xb).square().sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            sae.dec.div_(sae.dec.norm(dim=1, keepdim=True).clamp_min(1e-8))
    with torch.no_grad():
        err = (sae(x)[0] - x).square().sum() / (x - x.mean(0)).square().sum()
    return sae, float(err)


@dataclass(frozen=True)
class Change:
    """Per feature ``[n]``, from a first model's activations to a second's."""

    freq_a: Tensor
    freq_b: Tensor
    drift: Tensor
    new: Tensor  # bool
    lost: Tensor  # bool
    changed: Tensor  # bool

    def summary(self) -> dict[str, float]:
        live = (self.freq_a > 0) | (self.freq_b > 0)
        new_freq = self.freq_b[self.new]
        return {
            "live": int(live.sum()),
            "new": int(self.new.sum()),
            "lost": int(self.lost.sum()),
            "changed": int(self.changed.sum()),
            "mean_drift": float(self.drift[live].mean()) if live.any() else 0.0,
            "new_median_freq": float(new_freq.median()) if len(new_freq) else 0.0,
        }


def feature_change(a: Tensor, b: Tensor, min_freq: float = 0.01, threshold: float = 0.5) -> Change:
    """How each feature changes from activations ``a`` to ``b`` (``[tokens, n]``, the same
    tokens in both)."""
    if a.shape != b.shape:
        raise ValueError(f"activations differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    fa, fb = (a > 0).float().mean(0), (b > 0).float().mean(0)
    num = (a - b).square().sum(0)
    den = a.square().sum(0) + b.square().sum(0)
    drift = torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(den))
    new = (fa == 0) & (fb >= min_freq)
    lost = (fb == 0) & (fa >= min_freq)
    return Change(fa, fb, drift, new, lost, drift > threshold)


def mediators(base: Tensor, tuned: Tensor, n: int) -> Tensor:
    """The ``n`` features that fire most above the base in the tuned model on these
    tokens (``[tokens, features]`` each): their indices, strongest first."""
    gap = (tuned - base).mean(0)
    return gap.topk(min(n, gap.numel())).indices


def steer(h: Tensor, sae: TopKSAE, features: Tensor, gamma: float) -> Tensor:
    """``h`` (``[..., d]``) with ``features``' contribution scaled by ``gamma``."""
    a = sae.encode(h.reshape(-1, h.shape[-1]).float())
    keep = torch.zeros(a.shape[1], dtype=a.dtype)
    keep[features] = 1.0
    delta = (a * keep) @ sae.dec * (gamma - 1.0)
    return h + delta.view(h.shape).to(h.dtype)
