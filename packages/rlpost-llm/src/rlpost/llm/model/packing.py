"""Shared-prompt attention inside Hugging Face decoders.

``model.pack_prompts`` lays each micro-batch out as one sequence ``[prompt; r_1; ...;
r_N]`` per prompt (:func:`rlpost.kernels.ops.shared_prompt.pack_groups`). Through a plain
4D mask, attention over that sequence stays dense: ``(P + N R)^2`` scores per head, most
of them masked. :func:`shared_prompt_attention_mode` instead registers an attention
function with transformers' ``AttentionInterface`` that, for each packed row, calls
:func:`rlpost.kernels.ops.shared_prompt.shared_prompt_attention` on the prompt and the
responses (Triton on CUDA), so the response-to-other-response blocks are never computed.
The layout of the packed rows reaches the function through a context variable set for
the duration of one forward (and of each layer's recomputation under activation
checkpointing).

The ragged layout's rows are padded to the longest one, and a decoder computes every
padded position in every projection and MLP. :func:`packed_rows_attention_mode` instead
lays the rows' real tokens end to end in one sequence (:func:`flat_rows`): the per-token
layers see no padding at all, and only the attention function gathers queries, keys and
values into padded rows for fused SDPA calls and gathers the outputs back: into the
packed rows under their mask, or, where the layout was built for it
(``PackedGroups.sequences``: long sequences, half
the pairs or fewer), into each response's own ``[prompt; response]`` sequence,
right-padded, under plain causal attention (no mask built or kept; the fused kernels skip
the blocks above the diagonal, and a real query never sees a pad key, which comes after
it).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

NAME = "rlpost_shared_prompt"
ROWS = "rlpost_packed_rows"
# the active function's layout: [(P, N, L), ...] for NAME, a FlatRows for ROWS
_LAYOUT: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "rlpost_shared_prompt_layout", default=None
)
_registered = False
# the modules of a model that can checkpoint (transformers' GradientCheckpointingLayer),
# held weakly: under FSDP2 a layer's state references its root module and so the model,
# and a strong value would keep its own weak key alive (a model never freed)
_CHECKPOINTABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class FlatRows:
    """Padded packed rows ``[G, T]`` with their real tokens laid end to end (``Ttot``).

    ``keep [Ttot]``: the padded slot (flat index into ``G * T``) of each real token;
    ``src [G * T]``: the real token each padded slot reads (its own; padding reads token 0,
    whose copy nothing attends to and whose output is discarded); ``allow [G, 1, T, T]``:
    the rows' attention mask. Attending by sequence instead (:func:`flat_rows` with
    ``seqs``): ``buckets``, per length bucket the real token each slot of its ``[S_b,
    longest_b]`` right-padded sequences reads (padding reads token 0), and ``seq_out
    [Ttot]``, the slot (counted through the buckets in order) whose output each real token
    takes (a prompt's: the first of its sequences); ``allow`` is then ``None``."""

    keep: Tensor
    src: Tensor
    allow: Tensor | None
    G: int
    T: int
    buckets: list[Tensor] | None = None
    seq_out: Tensor | None = None

    def to(self, device) -> FlatRows:
        return FlatRows(
            self.keep.to(device), self.src.to(device),
            None if self.allow is None else self.allow.to(device), self.G, self.T,
            None if self.buckets is None else [b.to(device) for b in self.buckets],
            None if self.seq_out is None else self.seq_out.to(device),
        )  # fmt: skip


def flat_rows(
    tokens: list[int], T: int, allow: Tensor | None, seqs: list[list[int]] | None = None
) -> FlatRows:
    """:class:`FlatRows` of ``len(tokens)`` rows padded to ``T``, row ``r`` holding
    ``tokens[r]`` real tokens first (as :func:`rlpost.kernels.ops.shared_prompt.pack_groups`
    lays them out) and attending by ``allow [G, T, T]``, or, given ``seqs`` (each
    response's ``[prompt; response]`` slots, ``PackedGroups.seqs``), by sequence."""
    G = len(tokens)
    keep = torch.cat([r * T + torch.arange(n) for r, n in enumerate(tokens)])
    src = torch.zeros(G * T, dtype=torch.long)
    src[keep] = torch.arange(len(keep))
    if seqs is None:
        return FlatRows(keep, src, allow[:, None], G, T)
    buckets, seq_out = _sequence_slots(src, seqs)
    return FlatRows(keep, src, None, G, T, buckets, seq_out[keep])


def _sequence_slots(src: Tensor, seqs: list[list[int]]) -> tuple[list[Tensor], Tensor]:
    """:func:`flat_rows`' by-sequence part: per length bucket, the real token each slot of
    its right-padded sequences reads (padding reads 0), and per padded slot (``src``'s) the
    output slot it takes, counted through the buckets in order: its first occurrence (a
    prompt's: in the first of its sequences; -1 where no sequence holds the slot)."""
    from rlpost.kernels.ops.shared_prompt import concat_rows, length_buckets, long_tensor

    lens = long_tensor(len(s) for s in seqs)
    flat = concat_rows(seqs)  # every sequence's slots, end to end
    starts = lens.cumsum(0) - lens
    buckets, slots, outs, base = [], [], [], 0
    for members in length_buckets(lens.tolist()):
        m = long_tensor(members)
        j = torch.arange(int(lens[m[0]]))
        real = j < lens[m][:, None]  # [S_b, longest]
        slot = flat[(starts[m][:, None] + j).clamp_max(len(flat) - 1)]
        buckets.append(torch.where(real, src[slot], 0))
        slots.append(slot[real])
        outs.append(base + torch.arange(real.numel()).view(real.shape)[real])
        base += real.numel()
    slot, out = torch.cat(slots), torch.cat([*outs, torch.tensor([-1])])
    first = torch.full_like(src, len(slot))  # per padded slot: its first occurrence
    first.scatter_reduce_(0, slot, torch.arange(len(slot)), "amin")
    return buckets, out[first]


def _plain_attention_only(kwargs: dict, span: int) -> None:
    """Refuse what these functions do not compute: logit soft-capping, and a sliding
    window shorter than the packed rows (``span`` tokens, the farthest a query looks)."""
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if softcap is not None or (window is not None and window < span):
        what = f"softcap={softcap}" if softcap is not None else f"sliding_window={window}"
        raise ValueError(
            f"packed attention: the model's attention uses {what}, which the packed "
            "layouts do not implement; set model.pack_prompts=false"
        )


def _all_heads(x: Tensor, H: int) -> Tensor:
    """Grouped-query keys / values ``[B, h, T, d]`` repeated to the ``H`` query heads."""
    return x.repeat_interleave(H // x.shape[1], dim=1) if x.shape[1] < H else x


def _attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask,
    scaling,
    dropout: float = 0.0,
    **kwargs,
):
    """transformers attention function: ``query [B, H, T, d]`` (keys / values may have
    fewer heads) -> ``([B, T, H, d], None)`` for packed rows described by the layout."""
    from rlpost.kernels.ops.shared_prompt import shared_prompt_attention

    layout = _LAYOUT.get()
    if not isinstance(layout, list):
        raise RuntimeError(f"{NAME} attention used outside shared_prompt_attention_mode")
    _, H, T, d = query.shape
    _plain_attention_only(kwargs, T)  # (grouped keys / values go as they are: the op takes them)
    rows = []  # (split / unbind, not slices: their backward concatenates, fills nothing)
    groups = zip(layout, query.unbind(0), key.unbind(0), value.unbind(0), strict=True)
    for (P, N, L), q, k, v in groups:
        parts = [P, N * L, T - P - N * L]

        def responses(x: Tensor, N: int = N, L: int = L) -> Tensor:
            return x.unflatten(1, (N, L)).transpose(0, 1)  # [H, N L, d] -> [N, H, L, d]

        (q_p, q_r, _), (k_p, k_r, _), (v_p, v_r, _) = (x.split(parts, dim=1) for x in (q, k, v))
        out_p, out_r = shared_prompt_attention(
            q_p, k_p, v_p, responses(q_r), responses(k_r), responses(v_r), scale=scaling
        )
        row = [out_p, out_r.transpose(0, 1).reshape(H, N * L, d)]
        if parts[-1]:
            row.append(q.new_zeros(H, parts[-1], d))  # padding positions
        rows.append(torch.cat(row, dim=1))
    return torch.stack(rows).transpose(1, 2).contiguous(), None


def _rows_attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask,
    scaling,
    dropout: float = 0.0,
    **kwargs,
):
    """transformers attention function over :class:`FlatRows`: ``query [1, H, Ttot, d]``
    (keys / values may have fewer heads) -> ``([1, Ttot, H, d], None)``."""
    rows = _LAYOUT.get()
    if not isinstance(rows, FlatRows):
        raise RuntimeError(f"{ROWS} attention used outside packed_rows_attention_mode")
    _plain_attention_only(kwargs, rows.T)
    qkv = (query, key, value)
    if rows.buckets is not None:  # each [prompt; response] its own causal sequence
        outs = [_attend(slots, *qkv, None, dropout, scaling) for slots in rows.buckets]
        return torch.cat(outs).index_select(0, rows.seq_out)[None], None
    out = _attend(rows.src.view(rows.G, rows.T), *qkv, rows.allow, dropout, scaling)
    return out.index_select(0, rows.keep)[None], None


def _kv_heads(query: Tensor) -> int | None:
    """The query heads to repeat grouped key / value heads to before SDPA, or ``None``
    where SDPA reads them grouped (``enable_gqa``): on CPU, whose flash kernel takes
    grouped heads with or without a mask, so no per-head copies are made or kept. On
    CUDA the memory-efficient kernel, the one a masked call can take, does not take
    grouped heads, so the copies stay."""
    return None if query.device.type == "cpu" else query.shape[1]


def _attend(
    slots: Tensor, query: Tensor, key: Tensor, value: Tensor, mask, dropout: float, scaling
) -> Tensor:
    """``[S T, H, d]``: the flat sequence's queries, keys and values gathered into rows by
    ``slots [S, T]`` and attended in one SDPA call, under ``mask`` or, without one,
    causally (each row a right-padded sequence: a real query never sees a pad key)."""
    H, d = query.shape[1], query.shape[-1]
    heads = _kv_heads(query)
    out = torch.nn.functional.scaled_dot_product_attention(
        _gathered(query, slots),
        _gathered(key, slots, heads),
        _gathered(value, slots, heads),
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=mask is None,
        scale=scaling,
        enable_gqa=heads is None and key.shape[1] < H,
    )
    return out.transpose(1, 2).reshape(slots.numel(), H, d)


def _gathered(x: Tensor, slots: Tensor, heads: int | None = None) -> Tensor:
    """``x [1, h, Ttot, d]`` gathered into rows ``[S, h, T, d]`` by ``slots [S, T]`` (the
    token each row slot reads), the heads repeated to ``heads`` when given."""
    h, d = x.shape[1], x.shape[-1]
    S, T = slots.shape
    x = x[0].index_select(1, slots.view(-1)).view(h, S, T, d).transpose(0, 1)
    return x if heads is None else _all_heads(x, heads)


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    AttentionInterface.register(ROWS, _rows_attention)
    try:  # transformers builds no mask for these functions (the layout carries it)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        for name in (NAME, ROWS):
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, lambda *a, **k: None)
    except ImportError:  # pragma: no cover - older transformers
        pass
    _registered = True


def supports_shared_attention(model: torch.nn.Module) -> bool:
    """True for transformers models whose attention goes through ``AttentionInterface``."""
    cfg = getattr(model, "config", None)
    return hasattr(cfg, "_attn_implementation") and getattr(
        model, "_supports_attention_backend", False
    )


@contextlib.contextmanager
def _mode(model: torch.nn.Module, name: str, layout) -> Iterator[None]:
    cfg = model.config
    before = cfg._attn_implementation
    token = _LAYOUT.set(layout)
    cfg._attn_implementation = name
    try:
        yield
    finally:
        cfg._attn_implementation = before
        _LAYOUT.reset(token)


def _in_mode(fn, model: torch.nn.Module, name: str, layout):
    def run(*args, **kwargs):
        with _mode(model, name, layout):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def _attention_mode(model: torch.nn.Module, name: str, layout) -> Iterator[None]:
    """Within the block, ``model``'s attention is the function ``name`` over ``layout``;
    the previous implementation is restored after.

    Under activation checkpointing the backward recomputes each layer after this block has
    ended; so, for the block's duration, every checkpointed layer's checkpoint function is
    given a layer forward that enters the mode itself (the recomputation then attends the
    way the forward did, whichever checkpoint flavour the model was set up with)."""
    _register()
    swapped = []
    refs = _CHECKPOINTABLE.get(model)
    if refs is None:  # (walking every module each forward costs about a millisecond)
        refs = [weakref.ref(m) for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        _CHECKPOINTABLE[model] = refs
    for module in filter(None, (r() for r in refs)):
        ckpt = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and ckpt is not None:

            def wrapped(fn, *args, _ckpt=ckpt, **kwargs):
                return _ckpt(_in_mode(fn, model, name, layout), *args, **kwargs)

            swapped.append((module, module.__dict__.get("_gradient_checkpointing_func")))
            module._gradient_checkpointing_func = wrapped
    try:
        with _mode(model, name, layout):
            yield
    finally:
        for module, own in swapped:
            if own is None:
                del module._gradient_checkpointing_func
            else:
                module._gradient_checkpointing_func = own


def shared_prompt_attention_mode(
    model: torch.nn.Module, layout: list[tuple[int, int, int]]
) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``model``'s attention is the shared-prompt function for packed rows
    ``layout = [(P, N, L), ...]`` (one group per row, every response ``L`` long)."""
    return _attention_mode(model, NAME, layout)


def packed_rows_attention_mode(
    model: torch.nn.Module, rows: FlatRows
) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``model`` takes the real tokens of padded packed rows end to end
    (``input_ids [1, Ttot]``) and attends within each row by its mask (:class:`FlatRows`)."""
    return _attention_mode(model, ROWS, rows)
