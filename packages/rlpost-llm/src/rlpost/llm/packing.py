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
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

NAME = "rlpost_shared_prompt"
_LAYOUT: contextvars.ContextVar[list[tuple[int, int, int]] | None] = contextvars.ContextVar(
    "rlpost_shared_prompt_layout", default=None
)
_registered = False


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
    if layout is None:
        raise RuntimeError(f"{NAME} attention used outside shared_prompt_attention_mode")
    _, H, T, d = query.shape
    rep = H // key.shape[1]
    key = key.repeat_interleave(rep, dim=1) if rep > 1 else key
    value = value.repeat_interleave(rep, dim=1) if rep > 1 else value
    rows = []
    for g, (P, N, L) in enumerate(layout):
        q, k, v = query[g], key[g], value[g]  # [H, T, d]
        end = P + N * L

        def split(x: Tensor, end: int = end, P: int = P, N: int = N, L: int = L) -> Tensor:
            return x[:, P:end].reshape(H, N, L, d).transpose(0, 1)  # [N, H, L, d]

        out_p, out_r = shared_prompt_attention(
            q[:, :P], k[:, :P], v[:, :P], split(q), split(k), split(v), scale=scaling
        )
        row = [out_p, out_r.transpose(0, 1).reshape(H, N * L, d)]
        if end < T:
            row.append(q.new_zeros(H, T - end, d))  # padding positions
        rows.append(torch.cat(row, dim=1))
    return torch.stack(rows).transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    try:  # transformers builds no mask for this function (the layout carries it)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, lambda *a, **k: None)
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
def _mode(model: torch.nn.Module, layout: list[tuple[int, int, int]]) -> Iterator[None]:
    cfg = model.config
    before = cfg._attn_implementation
    token = _LAYOUT.set(layout)
    cfg._attn_implementation = NAME
    try:
        yield
    finally:
        cfg._attn_implementation = before
        _LAYOUT.reset(token)


def _in_mode(fn, model: torch.nn.Module, layout: list[tuple[int, int, int]]):
    def run(*args, **kwargs):
        with _mode(model, layout):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def shared_prompt_attention_mode(
    model: torch.nn.Module, layout: list[tuple[int, int, int]]
) -> Iterator[None]:
    """Within the block, ``model``'s attention is the shared-prompt function for packed rows
    ``layout = [(P, N, L), ...]``; the previous implementation is restored after.

    Under activation checkpointing the backward recomputes each layer after this block has
    ended; so, for the block's duration, every checkpointed layer's checkpoint function is
    given a layer forward that enters the mode itself (the recomputation then attends the
    way the forward did, whichever checkpoint flavour the model was set up with)."""
    _register()
    swapped = []
    for module in model.modules():
        ckpt = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and ckpt is not None:

            def wrapped(fn, *args, _ckpt=ckpt, **kwargs):
                return _ckpt(_in_mode(fn, model, layout), *args, **kwargs)

            swapped.append((module, module.__dict__.get("_gradient_checkpointing_func")))
            module._gradient_checkpointing_func = wrapped
    try:
        with _mode(model, layout):
            yield
    finally:
        for module, own in swapped:
            if own is None:
                del module._gradient_checkpointing_func
            else:
                module._gradient_checkpointing_func = own
