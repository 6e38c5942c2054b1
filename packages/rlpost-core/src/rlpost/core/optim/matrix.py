"""Matrix optimisers: Muon and Pion (catalog 000-14).

**Muon** orthogonalises the momentum of every matrix parameter with a quintic
Newton-Schulz (NS) iteration ``X <- a X + b (X X^T) X + c (X X^T)^2 X`` (``a, b, c =
3.4445, -4.7750, 2.0315``, 5 steps, ``X`` first divided by its Frobenius norm): all
singular values are pushed towards 1 ("spectral whitening"), the tail ones included.

**Pion** replaces the whitening with a high-pass NS iteration in two stages (our
construction from the abstract, which gives no coefficients):

1. ``X`` is divided by an estimate of its largest singular value (power iteration), so
   the relative singular values ``r = sigma / sigma_max`` lie in [0, 1] with the dominant
   one at 1.
2. *Promotion*: ``promote_steps`` iterations of the cubic NS polynomial
   ``p1(x) = 1.5 x - 0.5 x^3`` (fixed point 1 with zero slope). It lifts the dominant
   directions towards 1 and multiplies small ones by about 1.5 per step.
3. *Suppression*: ``suppress_steps`` iterations of ``p2(x) = 2.5 x^3 - 1.5 x^5``. Its
   fixed points are 0 and 1, both with zero slope (superlinear convergence), and
   ``sqrt(2/3) = 0.816``, which is repelling. Values promoted above 0.816 go to 1 and
   those below go to 0.

The cut is therefore the relative singular value that promotion lifts to 0.816:
:func:`pion_cut` gives 0.63, 0.45, 0.31 and 0.21 for 1 to 4 promotion steps. The filter
strength is set by ``promote_steps``, and its sharpness by ``suppress_steps``. Each step
is ``X <- a X + b (X X^T) X + c (X X^T)^2 X``, the same cost as Muon's.

**Per-head mode** (``heads=H``): a ``[H * d_head, d_model]`` projection is reshaped to
``[H, d_head, d_model]`` and each head's block is filtered on its own (a batched matmul:
no extra cost), preserving per-head differences in scale and spectrum.

Both are ``torch.optim`` optimisers with (Nesterov) momentum. Matrix parameters get the
orthogonalised update scaled by ``sqrt(max(1, rows / cols))``; other parameters get plain
momentum SGD steps, except in param groups marked ``adam=True``, which take AdamW steps
(the usual home of embeddings, output heads, norms and biases; the ``muon`` / ``pion``
entries of :data:`rlpost.core.optim.OPTIMIZERS` put them there).
"""

from __future__ import annotations

import abc
import math

import torch
from torch import Tensor

MUON_COEFFS = (3.4445, -4.7750, 2.0315)


def _as_rows(x: Tensor) -> tuple[Tensor, bool]:
    """Work on the wide orientation (rows <= cols) so ``X X^T`` is the small Gram matrix."""
    return (x.mT, True) if x.shape[-2] > x.shape[-1] else (x, False)


def _poly_iterate(x: Tensor, coeffs: tuple[float, float, float], steps: int) -> Tensor:
    a, b, c = coeffs
    for _ in range(steps):
        g = x @ x.mT
        x = a * x + (b * g + c * (g @ g)) @ x
    return x


def muon_orthogonalize(m: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Muon's quintic Newton-Schulz whitening of ``m [..., r, c]``."""
    x, flip = _as_rows(m.float())
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    x = _poly_iterate(x, MUON_COEFFS, steps)
    return (x.mT if flip else x).to(m.dtype)


def spectral_norm_estimate(x: Tensor, iters: int = 8) -> Tensor:
    """Largest singular value of ``x [..., r, c]`` by power iteration (``[..., 1, 1]``)."""
    v = torch.ones(*x.shape[:-2], x.shape[-1], 1, dtype=x.dtype, device=x.device)
    v = v / v.norm(dim=-2, keepdim=True)
    for _ in range(iters):
        v = x.mT @ (x @ v)
        v = v / (v.norm(dim=-2, keepdim=True) + 1e-30)
    return (x @ v).norm(dim=-2, keepdim=True)


PROMOTE = (1.5, -0.5, 0.0)  # p1(x) = 1.5 x - 0.5 x^3
SUPPRESS = (0.0, 2.5, -1.5)  # p2(x) = 2.5 x^3 - 1.5 x^5
SUPPRESS_THRESHOLD = math.sqrt(2.0 / 3.0)  # p2's repelling fixed point


def pion_cut(promote_steps: int) -> float:
    """Relative singular value that ``promote_steps`` promotions lift exactly to p2's
    threshold: larger ones survive the filter (go to 1), smaller ones are suppressed."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        x = mid
        for _ in range(promote_steps):
            x = 1.5 * x - 0.5 * x**3
        lo, hi = (mid, hi) if x < SUPPRESS_THRESHOLD else (lo, mid)
    return 0.5 * (lo + hi)


def pion_filter(
    m: Tensor,
    promote_steps: int = 2,
    suppress_steps: int = 5,
    heads: int | None = None,
    eps: float = 1e-7,
) -> Tensor:
    """Pion's high-pass NS iteration of ``m [..., r, c]`` (per head with ``heads``)."""
    if promote_steps < 0 or suppress_steps < 1:
        raise ValueError("need promote_steps >= 0 and suppress_steps >= 1")
    shape = m.shape
    x = m.float()
    if heads is not None:
        if shape[-2] % heads:
            raise ValueError(f"{shape[-2]} rows do not split into {heads} heads")
        x = x.reshape(*shape[:-2], heads, shape[-2] // heads, shape[-1])
    x, flip = _as_rows(x)
    x = x / (spectral_norm_estimate(x) + eps)  # the dominant direction at 1
    x = _poly_iterate(x, PROMOTE, promote_steps)
    x = _poly_iterate(x, SUPPRESS, suppress_steps)
    x = x.mT if flip else x
    return x.reshape(shape).to(m.dtype)


class _MatrixMomentum(torch.optim.Optimizer, abc.ABC):
    def __init__(self, params, lr: float, momentum: float, nesterov: bool, weight_decay: float):
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError(f"need lr > 0 and momentum in [0, 1), got {lr}, {momentum}")
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "wd": weight_decay}
        super().__init__(params, defaults)

    @abc.abstractmethod
    def _direction(self, m: Tensor, group: dict) -> Tensor:
        """The update direction of a matrix parameter from its momentum ``m``."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("adam"):
                self._adamw_step(group)
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                m = p.grad + group["momentum"] * buf if group["nesterov"] else buf
                if group["wd"]:
                    p.mul_(1 - group["lr"] * group["wd"])
                if p.dim() >= 2:
                    d = self._direction(m.reshape(p.shape[0], -1), group).reshape(p.shape)
                    scale = math.sqrt(max(1.0, p.shape[0] / d[0].numel()))
                    p.add_(d, alpha=-group["lr"] * scale)
                else:
                    p.add_(m, alpha=-group["lr"])
        return loss

    @staticmethod
    def _adamw_default(group: dict) -> None:
        group.setdefault("betas", (0.9, 0.999))
        group.setdefault("eps", 1e-8)

    def _adamw_step(self, group: dict) -> None:
        """AdamW for a param group marked ``adam=True`` (embeddings, heads, norms, biases:
        the parameters the matrix update is not meant for), with its own ``lr``,
        ``betas``, ``eps`` and ``wd``."""
        self._adamw_default(group)
        b1, b2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "exp_avg" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = float(state["step"])
            if group["wd"]:
                p.mul_(1 - group["lr"] * group["wd"])
            state["exp_avg"].lerp_(p.grad, 1 - b1)
            state["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (state["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(group["eps"])
            p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - b1**t))


class Muon(_MatrixMomentum):
    """Muon: momentum, then Newton-Schulz whitening of every matrix parameter's update."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr, momentum, nesterov, weight_decay)
        for g in self.param_groups:
            g.setdefault("ns_steps", ns_steps)

    def _direction(self, m: Tensor, group: dict) -> Tensor:
        return muon_orthogonalize(m, group["ns_steps"])


class Pion(_MatrixMomentum):
    """Pion (000-14): momentum, then the high-pass NS filter of every matrix parameter's
    update (``heads``: per-head mode for ``[H * d_head, d]`` projections; set it per param
    group)."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        promote_steps: int = 2,
        suppress_steps: int = 5,
        heads: int | None = None,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr, momentum, nesterov, weight_decay)
        opts = {"promote_steps": promote_steps, "suppress_steps": suppress_steps, "heads": heads}
        for g in self.param_groups:
            for k, v in opts.items():
                g.setdefault(k, v)

    def _direction(self, m: Tensor, group: dict) -> Tensor:
        return pion_filter(m, group["promote_steps"], group["suppress_steps"], group["heads"])


__all__ = [
    "Muon",
    "Pion",
    "muon_orthogonalize",
    "pion_cut",
    "pion_filter",
    "spectral_norm_estimate",
]
