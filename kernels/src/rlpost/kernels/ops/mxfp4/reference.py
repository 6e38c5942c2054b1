"""MXFP4 fake quantisation and its exact three-way error decomposition (catalog 000-13).

**Format (OCP MX).** Values are grouped in blocks of 32 along the last dimension. A block
shares a power-of-two scale ``s = 2^(floor(log2 amax) - 2)`` (E8M0; ``2`` is the exponent
of FP4's largest value 6 = 1.5 * 2^2) and each element is an FP4 E2M1 number from the grid
``{0, 0.5, 1, 1.5, 2, 3, 4, 6}`` (with sign), rounded to nearest, ties to the even
mantissa (0, 1, 2, 4), saturating at 6. ``Q_s(x) = s * round(x / s)``.

**Decomposition.** With the *ideal* continuous scale ``s* = amax / 6`` (the block maximum
lands exactly on the grid top), the error splits exactly:

    Q_s(x) - x = [Q_s(x) - Q_s*(x)]                 scale bias   (power-of-two rounding)
               + [-x]           where |x / s*| <= 1/4  deadzone truncation (zeroed)
               + [Q_s*(x) - x]  elsewhere              grid noise   (4-bit rounding)

The deadzone is the region ``Q_s*`` maps to 0 (below half the smallest magnitude 0.5), so
the last two parts are ``Q_s*(x) - x`` split by region, and the three sum to the total by
construction (up to floating-point rounding of the sum).

**Corrections** (each optional):

* *macro-block scaling*: a high-precision factor ``r in [1, 2)`` per macro-block of
  ``macro`` blocks divides the values first, so that the macro-block's largest value maps
  exactly to 6 under a power-of-two block scale; ``Q(x) = r Q_s(x / r)``. This removes the
  scale bias of the block holding the macro-block maximum and shrinks it elsewhere.
* *outlier fallback*: in each block the ``outliers`` entries with the largest
  quantisation error keep their exact value (e.g. a large value zeroed by the deadzone of
  a block with a bigger maximum, or a saturated one).
* *adaptive quantisation noise*: :class:`AdaptiveQuantNoise` adds Gaussian noise of std
  ``sigma * s`` (relative to each block's scale) and adapts ``sigma`` to keep a measured
  policy entropy near a target.

:func:`rlpost.kernels.ops.mxfp4.fake_quant` has a straight-through gradient (identity in
the backward pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK = 32
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
FP4_EMAX = 2  # exponent of the largest FP4 value (6 = 1.5 * 2^2)


def round_fp4(v: Tensor) -> Tensor:
    """Round to the signed E2M1 grid: nearest, ties to the even mantissa, saturating at 6."""
    grid = torch.tensor(GRID, dtype=v.dtype, device=v.device)
    even = torch.tensor([True, False, True, False, True, False, True, False], device=v.device)
    a = v.abs().clamp(max=FP4_MAX)
    hi = torch.searchsorted(grid, a.contiguous()).clamp(1, len(GRID) - 1)
    lo = hi - 1
    g_lo, g_hi = grid[lo], grid[hi]
    d_lo, d_hi = a - g_lo, g_hi - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & even[hi])
    return torch.sign(v) * torch.where(pick_hi, g_hi, g_lo)


def _blocks(x: Tensor, block: int) -> Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of {block}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def block_scales(xb: Tensor) -> tuple[Tensor, Tensor]:
    """``(power-of-two scale s, ideal scale s*)`` per block ``[..., nb, 1]``; an all-zero
    block gets ``s = s* = 1``."""
    amax = xb.abs().amax(-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    s = torch.exp2(torch.floor(torch.log2(safe)) - FP4_EMAX)
    return s, safe / FP4_MAX


@dataclass
class MXFP4Parts:
    """Quantised tensor and the error parts; ``scale_bias + deadzone + grid == q - x``."""

    q: Tensor
    scale_bias: Tensor
    deadzone: Tensor
    grid: Tensor

    @property
    def error(self) -> Tensor:
        return self.scale_bias + self.deadzone + self.grid


def quantize_mxfp4(
    x: Tensor, block: int = BLOCK, macro: int | None = None, outliers: int = 0
) -> Tensor:
    """MXFP4 fake-quantised copy of ``x`` (no gradient; see :func:`fake_quant`)."""
    return decompose_mxfp4(x, block, macro, outliers).q


def macro_factors(xb: Tensor, macro: int | None) -> Tensor:
    """Per-block factor ``r [..., nb, 1]`` of macro-block scaling (ones without it): each
    macro-block of ``macro`` blocks is divided by ``r in [1, 2)`` so its maximum lands on
    ``6 * 2^k``, exactly representable under a power-of-two block scale."""
    if not macro:
        return torch.ones_like(xb[..., :1])
    nb, block = xb.shape[-2], xb.shape[-1]
    if nb % macro:
        raise ValueError(f"{nb} blocks per row are not a multiple of macro={macro}")
    mb = xb.reshape(*xb.shape[:-2], nb // macro, macro * block)
    amax = mb.abs().amax(-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    top = FP4_MAX * torch.exp2(torch.floor(torch.log2(safe / FP4_MAX)))
    return (safe / top).repeat_interleave(macro, dim=-2)


def _fallback(xb: Tensor, parts: tuple[Tensor, ...], outliers: int) -> tuple[Tensor, ...]:
    """Outlier fallback: per block, the ``outliers`` entries with the largest error keep
    their exact value; their ideal-reference parts move into the scale bias, so the parts
    still sum to the (now zero) error there."""
    q, scale_bias, deadzone, grid = parts
    if outliers <= 0:
        return parts
    idx = (q - xb).abs().topk(min(outliers, xb.shape[-1]), dim=-1).indices
    keep = torch.zeros_like(xb, dtype=torch.bool).scatter_(-1, idx, True)
    return (
        torch.where(keep, xb, q),
        torch.where(keep, -(deadzone + grid), scale_bias),
        deadzone,
        grid,
    )


def decompose_mxfp4(
    x: Tensor, block: int = BLOCK, macro: int | None = None, outliers: int = 0
) -> MXFP4Parts:
    """Quantise ``x`` and split its error into scale bias, deadzone truncation and grid
    noise (see the module docstring). With ``macro`` (blocks per macro-block) and
    ``outliers`` (exact entries per block) the parts are those of the corrected
    quantiser: the ideal reference is unchanged, outlier entries have zero error."""
    xb = _blocks(x, block)
    r = macro_factors(xb, macro)
    s, _ = block_scales(xb / r)
    _, s_ideal = block_scales(xb)
    q = r * s * round_fp4(xb / r / s)
    ideal = s_ideal * round_fp4(xb / s_ideal)  # the reference: a continuous block scale
    dead = ideal == 0
    parts = (
        q,
        q - ideal,
        torch.where(dead, -xb, torch.zeros_like(xb)),
        torch.where(dead, torch.zeros_like(xb), ideal - xb),
    )
    parts = _fallback(xb, parts, outliers)
    return MXFP4Parts(*(t.reshape(x.shape) for t in parts))


class AdaptiveQuantNoise:
    """Adaptive quantisation noise (AQN): Gaussian noise of std ``sigma * s`` per block
    (``s`` the block's power-of-two scale) on top of the quantised values, with ``sigma``
    steered by the measured policy entropy: ``sigma <- clip(sigma * exp(rate * (target -
    entropy) / target), 0, sigma_max)``: more noise when the entropy is below target."""

    def __init__(
        self,
        target_entropy: float,
        sigma: float = 0.05,
        rate: float = 0.5,
        sigma_max: float = 1.0,
        block: int = BLOCK,
    ):
        if target_entropy <= 0 or sigma < 0 or rate < 0:
            raise ValueError("target_entropy must be > 0, sigma and rate >= 0")
        self.target, self.sigma, self.rate = target_entropy, sigma, rate
        self.sigma_max, self.block = sigma_max, block

    def update(self, entropy: float) -> float:
        step = math.exp(self.rate * (self.target - entropy) / self.target)
        self.sigma = min(max(self.sigma * step, 0.0), self.sigma_max)
        return self.sigma

    @torch.no_grad()
    def __call__(self, q: Tensor, generator: torch.Generator | None = None) -> Tensor:
        qb = _blocks(q, self.block)
        s, _ = block_scales(qb)
        noise = torch.randn(qb.shape, generator=generator, device=q.device, dtype=q.dtype)
        return (qb + self.sigma * s * noise).reshape(q.shape)
