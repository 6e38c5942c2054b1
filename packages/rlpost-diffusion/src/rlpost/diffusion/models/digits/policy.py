"""The digits model as a :class:`~rlpost.diffusion.models.base.FlowPolicy`."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rlpost.diffusion.models.base import Cond
from rlpost.diffusion.models.digits.data import parse_digit_prompts
from rlpost.diffusion.models.digits.nets import DigitsVelocityNet, load_digits_net
from rlpost.diffusion.models.digits.pretrained import build_digits_base


class DigitsPolicy:
    """:class:`~rlpost.diffusion.models.base.FlowPolicy` over a :class:`DigitsVelocityNet`.

    ``sample_shape = (1, 8, 8)`` (model space, [-1, 1]); prompts are digits (ints 0-9 or
    strings ``"0"``-``"9"``), conditioning ``{"labels": LongTensor [B]}``; ``decode`` maps
    to images in [0, 1]. The reference is a frozen deep copy of ``net`` taken at
    construction unless given.
    """

    sample_shape: tuple[int, ...] = (1, 8, 8)

    def __init__(self, net: DigitsVelocityNet, reference: DigitsVelocityNet | None = None):
        self.net = net
        self.reference = copy.deepcopy(net) if reference is None else reference
        self.reference.requires_grad_(False)
        self.reference.eval()

    @classmethod
    def pretrained(
        cls, cache_dir: str | os.PathLike | None = None, progress: bool = True
    ) -> DigitsPolicy:
        """The default cached base (built on first use, see :func:`build_digits_base`)."""
        return cls(load_digits_net(build_digits_base(cache_dir, progress=progress)))

    @classmethod
    def random(cls, seed: int = 0, **net_kwargs: Any) -> DigitsPolicy:
        """An untrained net (zero output layer, so ``v = 0``), no cache; for tests."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = DigitsVelocityNet(**net_kwargs)
        return cls(net)

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    def to(self, device: torch.device | str) -> DigitsPolicy:
        """Move both nets to ``device``; returns ``self``."""
        self.net.to(device)
        self.reference.to(device)
        return self

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        return self.net(x, sigma, cond["labels"])

    def reference_velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        with torch.no_grad():
            return self.reference(x, sigma, cond["labels"])

    def encode(self, prompts: Sequence[Any]) -> Cond:
        """``{"labels": [B]}`` on the policy's device; ``ValueError`` on a bad prompt."""
        return {"labels": parse_digit_prompts(prompts).to(self.device)}

    def decode(self, x: Tensor) -> Tensor:
        """Model space -> images ``[B, 1, 8, 8]`` in [0, 1]: ``((x + 1) / 2).clamp(0, 1)``."""
        return ((x + 1) / 2).clamp(0, 1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.net.parameters() if p.requires_grad]

    def trainable_module(self) -> nn.Module:
        return self.net
