"""PUST (catalog 004-04): a proxy's relative improvement transferred to a primary model.

The proxy explores: it is trained (cheaply) from ``phi_0`` to ``phi_1``. Its relative
improvement ``d = phi_1 - phi_0`` is the update signal, extracted once and cacheable, and
the primary receives it with a strength ``alpha``: ``theta' = theta + alpha d``. In weight
space this needs tensors of the same shape, tensor for tensor (the proxy and the primary
share an architecture); the caller refuses anything else.
"""

from __future__ import annotations

from torch import Tensor


def relative_update(initial: dict[str, Tensor], optimised: dict[str, Tensor]) -> dict[str, Tensor]:
    """``phi_1 - phi_0`` for every floating-point tensor of the optimised state."""
    return {k: v - initial[k] for k, v in optimised.items() if v.is_floating_point()}


def transfer(
    primary: dict[str, Tensor], update: dict[str, Tensor], alpha: float = 1.0
) -> dict[str, Tensor]:
    """``theta + alpha d`` for the tensors the update has (the others as they are)."""
    return {
        k: (w + alpha * update[k].to(w.dtype)) if k in update else w for k, w in primary.items()
    }
