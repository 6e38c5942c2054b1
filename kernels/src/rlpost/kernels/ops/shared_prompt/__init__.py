"""Shared-prompt attention (DualKV, catalog 000-21) and group packing.

:func:`shared_prompt_attention` dispatches to the Triton kernels on CUDA (when Triton is
installed) and to the torch reference elsewhere. Packing (:func:`pack_groups`) works with
any model that takes a 4D attention mask and position ids, e.g. Hugging Face decoders.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from rlpost.kernels.ops.shared_prompt.reference import (
    PackedGroups,
    pack_group,
    pack_groups,
    packing_ratio,
)
from rlpost.kernels.ops.shared_prompt.reference import (
    shared_prompt_attention as shared_prompt_attention_reference,
)


def shared_prompt_attention(
    q_p: Tensor,
    k_p: Tensor,
    v_p: Tensor,
    q_r: Tensor,
    k_r: Tensor,
    v_r: Tensor,
    scale: float | None = None,
    backend: Literal["auto", "triton", "reference"] = "auto",
) -> tuple[Tensor, Tensor]:
    """``(out_prompt [H, P, d], out_responses [N, H, R, d])``: causal attention over each
    ``[prompt; response_i]`` with the prompt's keys and values held once."""
    from rlpost.kernels import triton_available

    if backend not in ("auto", "triton", "reference"):
        raise ValueError(f"backend must be auto, triton or reference, got {backend!r}")
    if backend == "auto":
        backend = "triton" if q_r.is_cuda and triton_available() else "reference"
    if backend == "reference":
        return shared_prompt_attention_reference(q_p, k_p, v_p, q_r, k_r, v_r, scale)
    from rlpost.kernels.ops.shared_prompt.triton_impl import shared_prompt_attention_triton

    return shared_prompt_attention_triton(q_p, k_p, v_p, q_r, k_r, v_r, scale)


__all__ = ["PackedGroups", "pack_group", "pack_groups", "packing_ratio", "shared_prompt_attention"]
