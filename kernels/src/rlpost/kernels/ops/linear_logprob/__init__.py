"""Fused linear log-prob and entropy: ``(logp [N], entropy [N])`` of the sampled tokens
from hidden states and the LM-head weight, without ``[N, V]`` float32 logits.

``linear_logprob_entropy`` dispatches to the Triton kernels on CUDA (when Triton is
installed) and to the chunked torch reference elsewhere; ``backend`` forces one.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from rlpost.kernels.ops.linear_logprob.reference import (
    linear_logprob_entropy_naive,
    linear_logprob_entropy_reference,
)


def linear_logprob_entropy(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    temperature: float = 1.0,
    backend: Literal["auto", "triton", "reference"] = "auto",
    chunk: int = 4096,
) -> tuple[Tensor, Tensor]:
    """Log-probs of ``tokens`` and the full-vocabulary entropy under ``softmax(h W^T / T)``.

    ``hidden [N, D]``, ``weight [V, D]`` (same dtype), ``tokens [N]`` int64 in ``[0, V)``.
    Returns float32 ``[N]`` tensors; differentiable in ``hidden`` and ``weight``.
    """
    from rlpost.kernels import use_triton

    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden [N, D] and weight [V, D], got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if tokens.shape != hidden.shape[:1]:
        raise ValueError(f"tokens must be [N={hidden.shape[0]}], got {tuple(tokens.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if use_triton(backend, hidden):
        from rlpost.kernels.ops.linear_logprob.triton_impl import LinearLogprobEntropyTriton

        return LinearLogprobEntropyTriton.apply(hidden, weight, tokens, float(temperature))
    return linear_logprob_entropy_reference(hidden, weight, tokens, temperature, chunk)


__all__ = [
    "linear_logprob_entropy",
    "linear_logprob_entropy_naive",
    "linear_logprob_entropy_reference",
]
