"""The model interface every objective and sampler works against.

A :class:`FlowPolicy` is a trainable flow-matching velocity field ``v_theta(x, sigma, c)``
with a frozen reference ``v_ref`` (a frozen copy, or the same network with its LoRA
adapters disabled), a prompt encoder and a decoder to images. Convention (rectified flow,
as SD3 / diffusers): ``x_sigma = (1 - sigma) x0 + sigma eps``, velocity target ``eps - x0``;
``sigma = 1`` is pure noise, ``sigma = 0`` the clean sample.

Conditioning is a dict of tensors with the batch on dim 0 (``{"labels": [B]}`` for the
embedded class-conditional model, ``{"prompt_embeds": [B, L, D], "pooled": [B, D]}`` for
SD3), so it can be indexed and repeated without knowing the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

Cond = dict[str, Tensor]


def cond_index(cond: Cond, idx: Tensor | slice) -> Cond:
    """Rows ``idx`` of every conditioning tensor."""
    return {k: v[idx] for k, v in cond.items()}


def cond_repeat(cond: Cond, n: int) -> Cond:
    """Each row repeated ``n`` times in place (``[a, b] -> [a, a, b, b]`` for n=2)."""
    return {k: v.repeat_interleave(n, dim=0) for k, v in cond.items()}


def cond_cat(conds: Sequence[Cond]) -> Cond:
    return {k: torch.cat([c[k] for c in conds]) for k in conds[0]}


@runtime_checkable
class FlowPolicy(Protocol):
    """What the samplers, objectives and trainer need from a generator."""

    #: shape of one sample in the model's space (latents for SD3, pixels for the toy)
    sample_shape: tuple[int, ...]

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        """``v_theta(x, sigma, cond)``; ``sigma`` is ``[B]`` in [0, 1]. Differentiable."""
        ...

    def reference_velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        """``v_ref``: the frozen starting model (no gradient)."""
        ...

    def encode(self, prompts: Sequence[Any]) -> Cond:
        """Conditioning for a list of prompts (class ids for the toy, strings for SD3)."""
        ...

    def decode(self, x: Tensor) -> Tensor:
        """Images ``[B, C, H, W]`` in [0, 1] from samples (VAE decode for latents)."""
        ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def trainable_module(self) -> torch.nn.Module:
        """The module whose state a checkpoint saves (the LoRA-wrapped net, or the net)."""
        ...
