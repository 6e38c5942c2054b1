"""Shared-prompt attention (DualKV, catalog 000-21) and group packing.

:func:`shared_prompt_attention` dispatches to the Triton kernels on CUDA (when Triton is
installed); on CPU, where the prompt is long (:func:`.split.preferred`), to the split
form (``backend="split"``, :mod:`.split`: the responses over the prompt's keys and over
their own as two flash attentions merged by log-sum-exp, nothing copied); elsewhere to two
calls of torch's fused ``scaled_dot_product_attention`` (``backend="sdpa"``: the prompt
causally, then every response over a copy of the prompt's keys and its own);
``backend="reference"`` is the explicit softmax the others are tested against.
Packing (:func:`pack_groups`) works with any model that takes a 4D attention mask and
position ids, e.g. Hugging Face decoders; :func:`packed_work` counts what a layout
computes from the same plan, before anything is built.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlpost.kernels.ops.shared_prompt.reference import (
    PackedGroups,
    concat_rows,
    length_buckets,
    long_tensor,
    pack_group,
    pack_groups,
    packed_work,
    packing_ratio,
    pad_rows,
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
    backend: Literal["auto", "triton", "split", "sdpa", "reference"] = "auto",
) -> tuple[Tensor, Tensor]:
    """``(out_prompt [H, P, d], out_responses [N, H, R, d])``: causal attention over each
    ``[prompt; response_i]`` with the prompt's keys and values held once. Keys and values
    may have fewer heads than the queries (grouped-query attention: ``h`` dividing ``H``):
    the split backend reads them as they are, the others get them repeated."""
    from rlpost.kernels import triton_available
    from rlpost.kernels.ops.shared_prompt import split

    if backend not in ("auto", "triton", "split", "sdpa", "reference"):
        raise ValueError(f"backend must be auto, triton, split, sdpa or reference, got {backend!r}")
    if backend == "auto":
        on_cpu = q_r.device.type == "cpu" and split.available()
        if q_r.is_cuda and triton_available():
            backend = "triton"
        else:  # the split saves the prompt's copies, which pay where the prompt is long
            long = split.preferred(k_p.shape[-2], q_r.shape[-2])
            backend = "split" if on_cpu and long else "sdpa"
    if backend == "split":
        return split.shared_prompt_attention_split(q_p, k_p, v_p, q_r, k_r, v_r, scale)
    rep = q_p.shape[0] // k_p.shape[0]
    if rep > 1:  # grouped keys / values: one copy per query head for these backends
        k_p, v_p = k_p.repeat_interleave(rep, 0), v_p.repeat_interleave(rep, 0)
        k_r, v_r = k_r.repeat_interleave(rep, 1), v_r.repeat_interleave(rep, 1)
    if backend == "reference":
        return shared_prompt_attention_reference(q_p, k_p, v_p, q_r, k_r, v_r, scale)
    if backend == "sdpa":
        return shared_prompt_attention_sdpa(q_p, k_p, v_p, q_r, k_r, v_r, scale)
    from rlpost.kernels.ops.shared_prompt.triton_impl import shared_prompt_attention_triton

    return shared_prompt_attention_triton(q_p, k_p, v_p, q_r, k_r, v_r, scale)


def shared_prompt_attention_sdpa(
    q_p: Tensor, k_p: Tensor, v_p: Tensor, q_r: Tensor, k_r: Tensor, v_r: Tensor,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The op through torch's fused attention: the prompt causally, then each response's
    queries over ``[prompt keys; its own keys]`` under a ``[R, P + R]`` mask (the prompt
    whole, the response causal). The prompt's keys and values are copied once per response
    for the call (``N P d`` per head); no ``[N, R, P + R]`` score tensor is kept for the
    backward."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out_p = sdpa(q_p[None], k_p[None], v_p[None], is_causal=True, scale=scale)[0]
    N, H, R, d = q_r.shape
    P = k_p.shape[-2]
    k = torch.cat([k_p.expand(N, H, P, d), k_r], dim=2)
    v = torch.cat([v_p.expand(N, H, P, d), v_r], dim=2)
    allow = torch.ones(R, P + R, dtype=torch.bool, device=q_r.device).tril(P)
    return out_p, sdpa(q_r, k, v, attn_mask=allow, scale=scale)


__all__ = [
    "PackedGroups",
    "concat_rows",
    "length_buckets",
    "long_tensor",
    "pack_group",
    "pack_groups",
    "packed_work",
    "packing_ratio",
    "pad_rows",
    "shared_prompt_attention",
]
