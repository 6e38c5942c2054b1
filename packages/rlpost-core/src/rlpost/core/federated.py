"""Communication-efficient asynchronous federated policy updates (catalog 001-07).

Clients train locally from the server's weights and send back *updates* (their weights
minus the weights they started from), compressed; the server folds each update in as it
arrives, discounted by how stale it is. The pieces, all on flat ``[D]`` tensors:

* compression: :func:`topk_sparsify` (the ``ratio`` largest-magnitude entries, as indices
  and values) and :func:`quantize_int8` (per-tensor absmax to int8), each with its inverse
  and its size on the wire (:func:`wire_bytes`);
* :class:`ErrorFeedback`: what compression dropped is kept by the client and added to its
  next update (EF-SGD), so nothing is lost over rounds, only delayed;
* :func:`staleness_weight`: ``(1 + s)^-a`` for an update ``s`` server versions old
  (FedAsync's polynomial discount; ``a = 0``: no discount);
* :func:`aggregate`: the weighted mean of updates (by client sample counts and staleness
  weights), the synchronous FedAvg step when every staleness is 0.

Our reading: the abstract names communication efficiency, asynchrony and heterogeneous
computation, not the operators; top-k with error feedback, int8 and the polynomial
discount are the field's standard ones.

With equal-sized IID shards, one local SGD step per client and no compression, the
aggregate of the clients' updates *is* the centralised full-batch SGD step (the mean of the
shard gradients is the full gradient); ``tests/test_federated.py`` checks that exactly and
that error-feedback top-k reaches the centralised optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sparse:
    """A top-k sparsified update: ``values`` at flat ``indices`` of a ``[size]`` tensor."""

    indices: Tensor
    values: Tensor
    size: int


def topk_sparsify(delta: Tensor, ratio: float) -> Sparse:
    """Keep the ``ceil(ratio * D)`` largest-magnitude entries of ``delta`` ``[D]``."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"topk ratio must be in (0, 1], got {ratio}")
    flat = delta.reshape(-1)
    k = max(1, int(-(-ratio * flat.numel() // 1)))
    idx = flat.abs().topk(k).indices
    return Sparse(idx, flat[idx].clone(), flat.numel())


def densify(s: Sparse) -> Tensor:
    out = torch.zeros(s.size, dtype=s.values.dtype, device=s.values.device)
    out[s.indices] = s.values
    return out


@dataclass(frozen=True)
class Quantized:
    q: Tensor  # int8
    scale: float


def quantize_int8(delta: Tensor) -> Quantized:
    """Symmetric per-tensor int8: ``round(x / s)`` with ``s = max|x| / 127``."""
    m = float(delta.abs().max()) if delta.numel() else 0.0
    s = m / 127.0 if m > 0 else 1.0
    return Quantized(torch.round(delta / s).clamp(-127, 127).to(torch.int8), s)


def dequantize(q: Quantized) -> Tensor:
    return q.q.float() * q.scale


def wire_bytes(update: Tensor | Sparse | Quantized) -> int:
    """Bytes an update takes on the wire (values + indices / scale)."""
    if isinstance(update, Sparse):
        return update.values.numel() * update.values.element_size() + update.indices.numel() * 4
    if isinstance(update, Quantized):
        return update.q.numel() + 4
    return update.numel() * update.element_size()


@dataclass
class ErrorFeedback:
    """A client's compression memory: ``compress(delta)`` sends ``C(delta + residual)`` and
    keeps what ``C`` dropped as the next residual."""

    kind: str = "topk"  # topk | int8 | none
    ratio: float = 0.1
    residual: Tensor | None = field(default=None, repr=False)

    def compress(self, delta: Tensor) -> Tensor | Sparse | Quantized:
        x = delta if self.residual is None else delta + self.residual
        if self.kind == "none":
            self.residual = None
            return x
        sent: Sparse | Quantized
        if self.kind == "topk":
            sent = topk_sparsify(x, self.ratio)
            self.residual = x - densify(sent)
        elif self.kind == "int8":
            sent = quantize_int8(x)
            self.residual = x - dequantize(sent)
        else:
            raise ValueError(f"compression {self.kind!r}: one of topk, int8, none")
        return sent


def decode(update: Tensor | Sparse | Quantized) -> Tensor:
    """The dense ``[D]`` update a server receives."""
    if isinstance(update, Sparse):
        return densify(update)
    if isinstance(update, Quantized):
        return dequantize(update)
    return update


def staleness_weight(staleness: int, a: float = 0.5) -> float:
    """FedAsync's polynomial discount ``(1 + s)^-a`` of an update ``s`` versions old."""
    if staleness < 0:
        raise ValueError("staleness must be >= 0")
    return float((1.0 + staleness) ** -a)


def aggregate(
    updates: list[Tensor], samples: list[float] | None = None, staleness: list[int] | None = None,
    a: float = 0.5,
) -> Tensor:  # fmt: skip
    """Weighted mean of dense updates: weights ``n_i * (1 + s_i)^-a`` normalised by
    ``sum n_i`` (so stale updates count less and fresh equal ones give FedAvg)."""
    if not updates:
        raise ValueError("aggregate: no updates")
    n = samples or [1.0] * len(updates)
    s = staleness or [0] * len(updates)
    w = [ni * staleness_weight(si, a) for ni, si in zip(n, s, strict=True)]
    total = sum(n)
    return sum(wi * u for wi, u in zip(w, updates, strict=True)) / total
