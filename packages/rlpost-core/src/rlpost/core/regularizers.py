"""Regularisers and controllers around the policy loss: GAC, Dr. Post-Training, CPO, REVA-PO.

None of these is a per-token objective; each acts on the losses' *gradients*, on the
parameters, or on the KL term:

* **GAC** (catalog 000-06): :class:`GACController`, an adaptive SFT/RL mixing weight
  ``lam`` (loss ``lam L_sft + (1 - lam) L_rl``) set from online estimates of the two
  gradients' noise and of their disagreement (:func:`gac_signals`).
* **Dr. Post-Training** (catalog 001-12): :func:`dr_project`, the target-data gradient
  projected onto a feasible set of update directions built from general-data gradients;
  :func:`apply_dr_projection_` does it in place on ``p.grad`` before any ``torch.optim``
  step.
* **CPO** (catalog 004-18): :func:`movement_fisher` and :class:`CPORegularizer`, a
  quadratic prior-task KL surrogate whose diagonal Fisher is estimated from how far each
  parameter moved on the prior tasks (sparse: only the top ``density`` fraction is kept).
* **REVA-PO RER** (catalog 004-09): the ``reva_rer`` entry of
  :data:`rlpost.core.kl.KL_ESTIMATORS`, a per-response weighted KL
  (:func:`reva_response_weights`), and the ``reva_po`` preset.

All vectors here are flat ``[D]`` tensors (``D`` = number of parameters considered); the
helpers :func:`flat_grad` / :func:`set_flat_grad_` convert from and to ``p.grad``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlpost.core.kl import KL_ESTIMATORS, KLInput, KLOutput, KLParams, k1, k2, k3
from rlpost.core.masked import masked_mean
from rlpost.core.presets import Choice, Preset, register_preset

# ---------------------------------------------------------------------------------------
# helpers


def flat_grad(params: Iterable[Tensor]) -> Tensor:
    """Concatenate ``p.grad`` (zeros where ``None``) of ``params`` into one ``[D]`` vector."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def set_flat_grad_(params: Sequence[Tensor], flat: Tensor) -> None:
    """Write the ``[D]`` vector ``flat`` back into ``p.grad`` (inverse of :func:`flat_grad`)."""
    n = sum(p.numel() for p in params)
    if flat.shape != (n,):
        raise ValueError(f"flat gradient has shape {tuple(flat.shape)}, parameters hold {n}")
    i = 0
    for p in params:
        g = flat[i : i + p.numel()].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        i += p.numel()


# ---------------------------------------------------------------------------------------
# GAC (000-06): noise-aware SFT/RL mixing controller


@dataclass(frozen=True)
class GACSignals:
    """One step's noise / disagreement estimates (squared gradient-norm units)."""

    sft_var: float  # tr Cov of the mean SFT gradient of the step
    rl_var: float  # tr Cov of the mean RL gradient of the step
    disagreement: float  # estimate of ||E g_sft - E g_rl||^2 (noise-corrected, >= 0)


def gac_signals(sft_grads: Tensor, rl_grads: Tensor) -> GACSignals:
    """Noise and disagreement of the SFT and RL gradients from ``K`` micro-batch samples.

    ``sft_grads``, ``rl_grads``: ``[K, D]`` per-micro-batch gradients (``K >= 2``; any
    subset of the parameters, e.g. the last layers, keeps the overhead small). With
    ``gbar = mean_k g_k``:

        v     = sum_k ||g_k - gbar||^2 / (K (K - 1))        (variance of gbar, unbiased)
        d     = max(0, ||gbar_sft - gbar_rl||^2 - v_sft - v_rl)

    ``d`` is an unbiased (then clipped) estimate of the squared distance between the two
    expected gradients: the noise of the two means inflates ``||gbar_sft - gbar_rl||^2``
    by exactly ``v_sft + v_rl`` in expectation.
    """
    if sft_grads.dim() != 2 or sft_grads.shape != rl_grads.shape:
        raise ValueError(
            f"need two [K, D] gradient stacks of one shape, got {tuple(sft_grads.shape)} "
            f"and {tuple(rl_grads.shape)}"
        )
    K = sft_grads.shape[0]
    if K < 2:
        raise ValueError(f"variance needs K >= 2 micro-batch gradients, got {K}")
    s, r = sft_grads.double(), rl_grads.double()
    ms, mr = s.mean(0), r.mean(0)
    vs = ((s - ms) ** 2).sum() / (K * (K - 1))
    vr = ((r - mr) ** 2).sum() / (K * (K - 1))
    d = (((ms - mr) ** 2).sum() - vs - vr).clamp(min=0)
    return GACSignals(vs.item(), vr.item(), d.item())


class GACController:
    """GAC (catalog 000-06): adaptive SFT/RL mixing weight ``lam`` (weight of the SFT loss).

    Our reading of "a noise-aware controller that derives an adaptive mixing weight from
    online estimates of gradient variance and disagreement": the RL gradient ``g_rl`` is an
    unbiased but noisy estimate of the wanted direction ``g*``; the SFT gradient is less
    noisy but biased by ``g_sft - g_rl``. The mix ``lam g_sft + (1 - lam) g_rl`` has mean
    squared error ``lam^2 (v_sft + d) + (1 - lam)^2 v_rl``, minimised by

        lam* = (v_rl + eps) / (v_rl + v_sft + d + 2 eps)

    so ``lam`` rises with the RL noise and falls with the SFT noise and the disagreement.
    The abstract's three additions:

    1. *smoothing*: the signals are EMAs with factor ``smoothing`` (the first update sets
       them);
    2. *prior guidance*: ``target = (1 - prior_weight) lam* + prior_weight prior``;
    3. *bounded updates*: ``lam <- clip(lam + clip(target - lam, -max_step, max_step),
       lam_min, lam_max)``.

    Constant signals make ``target`` constant, so ``lam`` reaches the fixed point
    ``clip(target, lam_min, lam_max)`` in at most ``ceil(1 / max_step)`` updates and stays.
    Usage per step: ``lam = ctl.update(gac_signals(G_sft, G_rl))``, then
    ``loss = ctl.mix(sft_loss, rl_loss)``.
    """

    def __init__(
        self,
        init: float = 0.5,
        prior: float = 0.5,
        prior_weight: float = 0.1,
        smoothing: float = 0.9,
        max_step: float = 0.05,
        lam_min: float = 0.0,
        lam_max: float = 1.0,
        eps: float = 1e-12,
    ):
        if not 0.0 <= lam_min <= lam_max <= 1.0:
            raise ValueError(f"need 0 <= lam_min <= lam_max <= 1, got {lam_min}, {lam_max}")
        if not lam_min <= init <= lam_max:
            raise ValueError(f"init {init} is outside [lam_min, lam_max]")
        if not 0.0 <= prior <= 1.0 or not 0.0 <= prior_weight <= 1.0:
            raise ValueError(
                f"prior and prior_weight must lie in [0, 1], got {prior}, {prior_weight}"
            )
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        if max_step <= 0 or eps <= 0:
            raise ValueError(f"need max_step > 0 and eps > 0, got {max_step}, {eps}")
        self.lam = float(init)
        self.prior, self.prior_weight = prior, prior_weight
        self.smoothing, self.max_step = smoothing, max_step
        self.lam_min, self.lam_max, self.eps = lam_min, lam_max, eps
        self._ema: tuple[float, float, float] | None = None

    def target(self, s: GACSignals) -> float:
        """Prior-guided target ``(1 - rho) lam*(s) + rho prior`` of (smoothed) signals ``s``."""
        if min(s.sft_var, s.rl_var, s.disagreement) < 0:
            raise ValueError(f"signals must be >= 0, got {s}")
        star = (s.rl_var + self.eps) / (s.rl_var + s.sft_var + s.disagreement + 2 * self.eps)
        return (1 - self.prior_weight) * star + self.prior_weight * self.prior

    def update(self, s: GACSignals) -> float:
        """Smooth the signals, move ``lam`` a bounded step towards the target; return it."""
        new = (s.sft_var, s.rl_var, s.disagreement)
        b = self.smoothing
        ema = (
            new
            if self._ema is None
            else tuple(b * o + (1 - b) * n for o, n in zip(self._ema, new, strict=True))
        )
        self._ema = ema  # type: ignore[assignment]
        t = self.target(GACSignals(*ema))
        step = min(max(t - self.lam, -self.max_step), self.max_step)
        self.lam = min(max(self.lam + step, self.lam_min), self.lam_max)
        return self.lam

    def mix(self, sft_loss: Tensor, rl_loss: Tensor) -> Tensor:
        """``lam L_sft + (1 - lam) L_rl`` with the current ``lam``."""
        return self.lam * sft_loss + (1.0 - self.lam) * rl_loss

    def state_dict(self) -> dict:
        return {"lam": self.lam, "ema": self._ema}

    def load_state_dict(self, state: dict) -> None:
        self.lam = float(state["lam"])
        self._ema = None if state["ema"] is None else tuple(state["ema"])


# ---------------------------------------------------------------------------------------
# Dr. Post-Training (001-12): project the target gradient onto a data-induced feasible set


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


# ---------------------------------------------------------------------------------------
# CPO (004-18): prior-task Fisher surrogate from parameter movement


def movement_fisher(
    start: Sequence[Tensor], end: Sequence[Tensor], density: float = 0.1
) -> list[Tensor]:
    """CPO (catalog 004-18) Fisher surrogate of one finished task from parameter movement.

    ``start`` / ``end``: the parameters before and after training on the task. With
    ``delta = end - start`` over all ``N`` entries of all tensors:

        F_i = delta_i^2 / mean_j delta_j^2      for the k = ceil(density N) largest delta_i^2
        F_i = 0                                 otherwise (sparse regulariser)

    Rationale (the abstract's "parameter movement as a gradient-free proxy for Fisher
    sensitivity"): entries the prior task pushed far are the ones its objective was
    sensitive to; normalising by the mean makes ``F`` unit-free, so one coefficient fits
    every model. Ties at the cut are all kept. No movement at all gives ``F = 0``.

    Memory: besides the float32 ``delta^2`` tensors it returns (as ``F``, in place), it
    allocates no copy of all N entries: the mean is a float64 sum over the tensors and the
    exact k-th largest value is found by a binary search on its float32 bit pattern (31
    counting passes, :func:`_kth_largest`), not by a ``topk`` over the concatenation.
    """
    if len(start) != len(end) or any(a.shape != b.shape for a, b in zip(start, end, strict=True)):
        raise ValueError("start and end must hold tensors of the same shapes")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    sq = [
        (b.detach().float() - a.detach().float()).square_() for a, b in zip(start, end, strict=True)
    ]
    n = sum(s.numel() for s in sq)
    total = sum(float(s.sum(dtype=torch.float64)) for s in sq)
    if total == 0:
        return [s.zero_() for s in sq]
    mean = total / n
    cut = _kth_largest(sq, max(1, math.ceil(density * n)))
    return [s.masked_fill_(s < cut, 0.0).div_(mean) for s in sq]


def _kth_largest(values: Sequence[Tensor], k: int) -> float:
    """Exact k-th largest entry of non-negative float32 tensors, without concatenating them.

    Non-negative float32 values order like their int32 bit patterns, so the largest bit
    pattern ``v`` with ``#{x >= v} >= k`` is found by bisection over [0, 2^31): each step
    counts over every tensor (a bool temporary per tensor, no copy of all entries)."""
    lo, hi = 0, (1 << 31) - 1  # invariant: count(bits >= lo) >= k > count(bits > hi)
    bits = [v.reshape(-1).view(torch.int32) for v in values]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(int((b >= mid).sum()) for b in bits) >= k:
            lo = mid
        else:
            hi = mid - 1
    return float(torch.tensor(lo, dtype=torch.int32).view(torch.float32))


class CPORegularizer:
    """CPO (catalog 004-18): replay-free penalty on behavioural drift from prior tasks.

    The prior-task KL ``KL(pi_anchor || pi_theta)`` is locally
    ``(1/2) (theta - theta*)^T F (theta - theta*)``; CPO replaces ``F`` by the diagonal
    movement surrogate of :func:`movement_fisher`, summed over the finished tasks:

        R(theta) = (coef / 2) sum_i F_i (theta_i - theta*_i)^2,
        grad R   = coef F (theta - theta*)        (0 at the anchor theta*)

    ``theta*`` are the parameters at the end of the last finished task. Use:
    ``reg.begin_task()`` before a task, ``reg.end_task()`` after it, and
    ``loss = task_loss + reg.penalty()`` while training on later tasks. The penalty is 0
    until a task has ended.
    """

    def __init__(self, params: Iterable[Tensor], coef: float = 1.0, density: float = 0.1):
        if coef < 0:
            raise ValueError(f"coef must be >= 0, got {coef}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must lie in (0, 1], got {density}")
        self.params = list(params)
        self.coef, self.density = coef, density
        self.fisher: list[Tensor] | None = None
        self.anchor: list[Tensor] | None = None
        self._start: list[Tensor] | None = None

    def begin_task(self) -> None:
        self._start = [p.detach().clone() for p in self.params]

    def end_task(self) -> None:
        if self._start is None:
            raise RuntimeError("end_task() without begin_task()")
        f = movement_fisher(self._start, [p.detach() for p in self.params], self.density)
        self.fisher = (
            f if self.fisher is None else [a + b for a, b in zip(self.fisher, f, strict=True)]
        )
        self.anchor = [p.detach().clone() for p in self.params]
        self._start = None

    def penalty(self) -> Tensor:
        if self.fisher is None or self.anchor is None:
            return self.params[0].new_zeros(())
        total = sum(
            (f * (p - a) ** 2).sum()
            for p, f, a in zip(self.params, self.fisher, self.anchor, strict=True)
        )
        return 0.5 * self.coef * total

    def state_dict(self) -> dict:
        """Fisher, anchor and, mid-task, the task's start parameters (so that a run resumed
        between ``begin_task()`` and ``end_task()`` can still end the task)."""
        return {"fisher": self.fisher, "anchor": self.anchor, "start": self._start}

    def load_state_dict(self, state: dict) -> None:
        self.fisher, self.anchor = state["fisher"], state["anchor"]
        self._start = state.get("start")  # absent in states saved before it was recorded


# ---------------------------------------------------------------------------------------
# REVA-PO (004-09): response-weighted KL (RER)


@dataclass(frozen=True)
class ResponseWeightedKLParams:
    alpha: float = 0.5  # advantage sensitivity
    gamma: float = 0.5  # reference-entropy sensitivity (per nat)
    w_min: float = 0.1
    w_max: float = 10.0
    estimator: Literal["k1", "k2", "k3"] = "k3"
    straight_through: bool = False
    clamp: float | None = 10.0
    # centre of the reference entropy (nats per token). A fixed centre keeps the loss
    # split-invariant (micro-batching = full batch); None: the mean over the valid tokens
    # of the tensors passed in (each micro-batch its own mean: not split-invariant)
    entropy_center: float | None = 0.0

    def __post_init__(self) -> None:
        if self.entropy_center is not None and not math.isfinite(self.entropy_center):
            raise ValueError(f"entropy_center must be finite or None, got {self.entropy_center}")
        if self.alpha < 0 or self.gamma < 0:
            raise ValueError(f"alpha and gamma must be >= 0, got {self.alpha}, {self.gamma}")
        if not 0 < self.w_min <= 1.0 <= self.w_max:
            raise ValueError(f"need 0 < w_min <= 1 <= w_max, got {self.w_min}, {self.w_max}")
        if self.estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"estimator must be k1, k2 or k3, got {self.estimator!r}")


def reva_response_weights(
    advantages: Tensor,
    ref_entropy: Tensor,
    mask: Tensor | None,
    p: ResponseWeightedKLParams,
) -> Tensor:
    """Detached per-response KL weights ``[B]`` of REVA-PO's RER (catalog 004-09).

        a_i = A_i ([B]) or the masked mean of A_i,t ([B, T])
        h_i = masked mean over t of H_ref,t - c       (c = ``entropy_center``)
        w_i = clip(exp(-alpha a_i - gamma h_i), w_min, w_max)

    High-advantage responses get a smaller weight (constraint relaxed), low-advantage ones
    a larger weight (tightened), as the abstract states. The entropy direction is our
    reading: where the reference is uncertain (high entropy) it is a weaker anchor, so the
    constraint is relaxed there. The centre c only rescales every weight by exp(gamma c),
    i.e. the effective ``kl_coef``: set it near the typical reference entropy per token to
    keep the typical response at w ~ 1 (with the default c = 0 the weights are
    exp(-gamma H) < 1 and ``kl_coef`` acts smaller). A fixed c keeps micro-batching exact;
    ``None`` centres on the mean of the tensors passed in, i.e. of each micro-batch under
    gradient accumulation, so the loss then depends (slightly) on the split. Masked
    entries are never read (``-inf`` / NaN padding is harmless).
    """
    B = advantages.shape[0]
    H = ref_entropy.detach()
    A = advantages.detach().to(H.dtype)
    a = A if A.dim() == 1 else masked_mean(A, mask, dim=1)
    h_resp = masked_mean(H, mask, dim=1)
    centre = masked_mean(H, mask) if p.entropy_center is None else p.entropy_center
    h = h_resp - centre  # relative to the fixed centre (or the passed tensors' mean)
    w = torch.exp(-p.alpha * a - p.gamma * h).clamp(p.w_min, p.w_max)
    return w.reshape(B)


_BASE = {"k1": k1, "k2": k2, "k3": k3}


@KL_ESTIMATORS.register("reva_rer", ResponseWeightedKLParams)
def reva_rer(inp: KLInput, p: ResponseWeightedKLParams) -> KLOutput:
    """REVA-PO response-weighted KL (RER, catalog 004-09), ``[B, T]``.

        kl_i,t = sg(w_i) * k(log pi_i,t - log pi_ref_i,t) * m_i,t

    ``k``: the ``estimator`` (k1 / k2 / k3, see :mod:`rlpost.core.kl`), ``w_i`` from
    :func:`reva_response_weights`. Needs ``KLInput.advantages`` (``[B]`` or ``[B, T]``;
    :meth:`Recipe.policy_loss` passes them). The reference entropy is
    ``KLInput.ref_entropy`` when given, else the sampled-token estimate ``-log pi_ref(y_t)``
    (cross-entropy of the sample under the reference; exact entropy needs the reference's
    logits). The weight is detached, so the gradient is ``w_i`` times the base estimator's.
    Not usable as an in-reward KL (``kl_reward_penalty`` has no advantages).
    """
    if inp.advantages is None:
        raise ValueError(
            "reva_rer needs KLInput.advantages ([B] or [B, T]) for its per-response weights"
        )
    base = _BASE[p.estimator](inp, KLParams(p.straight_through, p.clamp)).kl
    H = inp.ref_entropy if inp.ref_entropy is not None else -inp.ref_logp
    w = reva_response_weights(inp.advantages, H.detach().to(base.dtype), inp.mask, p)
    return KLOutput(base * w[:, None])


register_preset(
    Preset(
        name="reva_po",
        paper="REVA-PO: response-weighted and validation-anchored policy optimisation (catalog 004-09)",
        catalog_id="004-09",
        advantage=Choice("grpo", {"scale_by_std": True}),
        objective=Choice("ppo_clip", {"clip_low": 0.2, "clip_high": 0.2}),
        aggregation=Choice("seq_mean_token_mean"),
        kl=Choice("reva_rer", {"alpha": 0.5, "gamma": 0.5, "estimator": "k3"}),
        kl_coef=0.04,
        group_size=8,
        notes="GRPO with the KL weighted per response by advantage and reference entropy "
        "(RER); VAPR (reset policy and reference to the best validation checkpoint) is a "
        "trainer step; alpha, gamma 0.5 and beta 0.04 are ours",
    )
)


__all__ = [
    "CPORegularizer",
    "GACController",
    "GACSignals",
    "ResponseWeightedKLParams",
    "apply_dr_projection_",
    "dr_project",
    "flat_grad",
    "gac_signals",
    "movement_fisher",
    "reva_response_weights",
    "set_flat_grad_",
]
