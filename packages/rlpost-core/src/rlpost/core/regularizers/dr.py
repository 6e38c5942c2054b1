"""Dr. Post-Training (catalog 001-12): the target-data gradient projected onto a feasible
set of update directions built from general-data gradients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.regularizers.base import (
    REGULARIZERS,
    GradientInput,
    GradientOutput,
    flat_grad,
    set_flat_grad_,
)


def _nnls_gram(Q: Tensor, c: Tensor, iters: int, tol: float) -> Tensor:
    """argmin_{w >= 0} w^T Q w / 2 - c^T w by cyclic coordinate descent (``Q`` PSD, ``[M, M]``;
    ``M`` = number of general-data gradients, small). Zero-norm rows get ``w = 0``.

    The ``[M, M]`` problem is solved on the CPU in float64 Python scalars (one transfer
    in, one out), so the per-coordinate loop costs no accelerator synchronisations.
    Returns ``w`` on ``Q``'s device."""
    M = Q.shape[0]
    q = Q.detach().to("cpu", torch.float64).tolist()
    cc = c.detach().to("cpu", torch.float64).tolist()
    w = [0.0] * M
    scale = max(max((q[j][j] for j in range(M)), default=0.0), 1e-300)
    for _ in range(iters):
        moved = 0.0
        for j in range(M):  # coordinates of the small dual problem, not the batch
            if q[j][j] <= 1e-12 * scale:
                continue
            qw = sum(q[j][i] * w[i] for i in range(M))
            new = max(0.0, w[j] + (cc[j] - qw) / q[j][j])
            moved = max(moved, abs(new - w[j]))
            w[j] = new
        if moved <= tol * (1.0 + max(abs(x) for x in w)):
            break
    return torch.tensor(w, dtype=Q.dtype, device=Q.device)


CHUNK = 1 << 24  # columns of [M, D] gradients converted to float64 at a time


def _gram(H: Tensor, g: Tensor, chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """``H H^T`` ``[M, M]`` and ``H g`` ``[M]`` in float64, accumulated over column chunks
    of ``H`` ``[M, D]`` / ``g`` ``[D]`` (never a float64 copy of the whole ``[M, D]``)."""
    M, D = H.shape
    Q = torch.zeros(M, M, dtype=torch.float64, device=H.device)
    Hg = torch.zeros(M, dtype=torch.float64, device=H.device)
    for i in range(0, D, chunk):  # loop over parameter chunks, vectorised inside
        h, gc = H[:, i : i + chunk].double(), g[i : i + chunk].double()
        Q += h @ h.T
        Hg += h @ gc
    return Q, Hg


def dr_project(
    target: Tensor,
    general: Tensor,
    feasible: Literal["none", "agree", "cone"] = "agree",
    strength: float = 1.0,
    iters: int = 500,
    tol: float = 1e-12,
) -> Tensor:
    """Dr. Post-Training (catalog 001-12): the target-data update direction projected onto a
    feasible set built from the general-data gradients.

    ``target`` ``[D]``: gradient of the scarce target data. ``general`` ``[M, D]``: ``M``
    gradients of general-data batches. Feasible sets, from no regularisation to the
    strongest:

    * ``none``: ``K = R^D``, so ``d = g`` (standard training on the target data);
    * ``agree``: ``K = {d : <d, h_j> >= 0 for all j}`` (no general batch's loss may rise to
      first order). ``d = g + sum_j mu_j h_j`` with ``mu >= 0`` the solution of the dual
      ``min_mu ||g + H^T mu||^2 / 2``; ``d = g`` exactly when ``g`` agrees with every
      ``h_j`` (or ``M = 0``), and a single conflicting ``h`` loses its component:
      ``d = g - (<g, h> / ||h||^2) h``;
    * ``cone``: ``K = {sum_j w_j h_j : w >= 0}``: the update is a non-negative reweighting
      of general data whose gradient best matches the target's (gradient-matching data
      selection, ``w`` = selection weights); ``d = g`` when ``g`` is in the cone, ``d = 0``
      for ``M = 0`` (nothing to select).

    ``strength`` ``s`` in [0, 1] sets the regularisation strength on the bias-variance
    spectrum: ``d_s = (1 - s) g + s Proj_K(g)`` (``s = 0``: plain training). The ``[M, M]``
    Gram matrix and ``H g`` are accumulated in float64 over column chunks of ``general``
    (:func:`_gram`; extra memory O(M * chunk), not float64 copies of ``[M, D]`` and
    ``[D]``), the ``M``-dimensional non-negative least squares runs on the CPU, and
    ``d = g + H^T mu`` (or ``H^T w``) is assembled chunk by chunk in ``target``'s dtype.
    Returns ``[D]`` in ``target``'s dtype.
    """
    if target.dim() != 1 or general.dim() != 2 or general.shape[1] != target.shape[0]:
        raise ValueError(
            f"need target [D] and general [M, D], got {tuple(target.shape)}, {tuple(general.shape)}"
        )
    if feasible not in ("none", "agree", "cone"):
        raise ValueError(f"feasible must be 'none', 'agree' or 'cone', got {feasible!r}")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must lie in [0, 1], got {strength}")
    if feasible == "none" or strength == 0.0:
        return target.clone()
    M = general.shape[0]
    if M == 0:
        return target.clone() if feasible == "agree" else target * (1.0 - strength)
    Q, Hg = _gram(general, target, CHUNK)
    if feasible == "agree":
        if bool((Hg >= 0).all()):
            return target.clone()
        coef, keep_g = _nnls_gram(Q, -Hg, iters, tol), 1.0  # d = g + s H^T mu
    else:
        coef, keep_g = _nnls_gram(Q, Hg, iters, tol), 1.0 - strength  # (1 - s) g + s H^T w
    out = torch.empty_like(target)
    for i in range(0, target.shape[0], CHUNK):  # assemble d chunk by chunk in float64
        h = general[:, i : i + CHUNK].double()
        d = keep_g * target[i : i + CHUNK].double() + strength * (h.T @ coef)
        out[i : i + CHUNK] = d.to(target.dtype)
    return out


def apply_dr_projection_(
    params: Sequence[Tensor],
    general: Tensor,
    feasible: Literal["none", "agree", "cone"] = "agree",
    strength: float = 1.0,
) -> Tensor:
    """Replace ``p.grad`` (the target-data gradient) by :func:`dr_project` of it, in place,
    before ``optimizer.step()``; ``general`` ``[M, D]`` holds flattened general-data
    gradients of the same ``params`` (:func:`flat_grad` after each general backward).
    Returns the projected ``[D]`` vector."""
    d = dr_project(flat_grad(params), general, feasible, strength)
    set_flat_grad_(params, d)
    return d


@dataclass(frozen=True)
class DrParams:
    feasible: Literal["none", "agree", "cone"] = "agree"
    strength: float = 1.0  # s in [0, 1]: (1 - s) g + s Proj_K(g)
    iters: int = 500

    def __post_init__(self) -> None:
        if self.feasible not in ("none", "agree", "cone"):
            raise ValueError(f"feasible must be 'none', 'agree' or 'cone', got {self.feasible!r}")
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must lie in [0, 1], got {self.strength}")
        if self.iters < 1:
            raise ValueError(f"iters must be >= 1, got {self.iters}")


@REGULARIZERS.register("dr_post_training", DrParams, needs={Input.AUX_GRADIENTS})
def dr_post_training(inp: GradientInput, p: DrParams) -> GradientOutput:
    """Dr. Post-Training (catalog 001-12): ``grad`` (the scarce target objective's gradient,
    here the RL loss) replaced by :func:`dr_project` onto the feasible set built from the
    general-data gradients ``aux_grads`` ``[M, D]``. Metric ``dr/changed``: the relative
    change ``||d - g|| / ||g||``; ``dr/conflicts``: general batches whose loss ``g`` would
    raise to first order (``<g, h_j> < 0``)."""
    g, H = inp.grad, inp.aux_grads
    d = dr_project(g, H.to(g.dtype), p.feasible, p.strength, p.iters)
    gn = float(g.norm())
    return GradientOutput(
        d,
        {},
        {
            "dr/changed": float((d - g).norm()) / gn if gn > 0 else 0.0,
            "dr/conflicts": float(((H.to(g.dtype) @ g) < 0).sum()),
        },
    )
