"""RELEX (catalog 000-12): a run's weight trajectory extrapolated along its rank-1 subspace.

RLVR's parameter deltas ``Delta_t = theta_t - theta_0`` are close to rank one, and the
size of their projection on that direction grows about linearly with the step. For one
tensor, with the observed checkpoints' deltas as the rows of ``D`` (``[T, n]``, the
flattened tensor; the base itself, ``Delta_0 = 0`` at step 0, is a row too):

```
D = U S V^T,  v = V[:, 0]                  (the rank-1 direction, sign: the coefficient grows)
c_t = <Delta_t, v>                          (its coefficient at each observed step)
c_t ~ a + b t                               (least squares over the observation window)
theta(t*) = theta_0 + (a + b t*) v          (any step, inside or beyond the window)
```

:func:`fit` returns the direction, coefficients and line; ``energy = s_1^2 / sum s_i^2``
is the share of the deltas' squared norm the direction holds. Everything here is pure
tensor math; reading and writing checkpoints is ``rlpost.llm.tools.relex``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Rank1Fit:
    direction: Tensor  # [n] unit vector
    coefficients: Tensor  # [T] <Delta_t, v> at the observed steps
    intercept: float
    slope: float
    energy: float  # s_1^2 / sum s_i^2 (1 for an exactly rank-1 trajectory)
    r2: float  # of the line through the coefficients (1 for an exactly linear one)

    def at(self, step: float) -> Tensor:
        """The extrapolated delta at ``step``: ``(a + b step) v``."""
        return (self.intercept + self.slope * step) * self.direction


def fit(deltas: Tensor, steps: Tensor) -> Rank1Fit:
    """The rank-1 direction of ``deltas`` (``[T, n]``, one observed delta per row, float64
    inside) and the line through its coefficients over ``steps`` (``[T]``)."""
    d = deltas.double().flatten(1)
    s = steps.double()
    if d.shape[0] != s.shape[0] or d.shape[0] < 2:
        raise ValueError(
            f"need >= 2 observed deltas, one per step; got {tuple(d.shape)} and {len(s)}"
        )
    _, sing, vh = torch.linalg.svd(d, full_matrices=False)
    v = vh[0]
    c = d @ v
    xm, cm = s.mean(), c.mean()
    sxx = ((s - xm) ** 2).sum()
    slope = ((s - xm) * (c - cm)).sum() / sxx if sxx > 0 else torch.zeros((), dtype=d.dtype)
    if slope < 0:  # the direction the run moves in: a growing coefficient
        v, c, slope = -v, -c, -slope
    intercept = c.mean() - slope * xm
    resid = c - (intercept + slope * s)
    total = ((c - c.mean()) ** 2).sum()
    r2 = float(1 - (resid**2).sum() / total) if total > 0 else 1.0
    power = (sing**2).sum()
    energy = float(sing[0] ** 2 / power) if power > 0 else 1.0
    return Rank1Fit(v.to(deltas.dtype), c.to(deltas.dtype), float(intercept), float(slope),
                    energy, r2)  # fmt: skip


def overall_energy(fits: dict[str, Rank1Fit], norms: dict[str, float]) -> float:
    """The share of all tensors' summed squared delta norms (``norms``: each tensor's
    ``sum_t ||Delta_t||^2``) that their rank-1 directions hold."""
    total = sum(norms.values())
    return sum(fits[k].energy * norms[k] for k in fits) / total if total > 0 else 1.0
