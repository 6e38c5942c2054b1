"""The velocity network of the digits model, its flow-matching pretraining and a minimal
Euler sampler."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from rlpost.diffusion.models.digits._build import warmup_cosine as _warmup_cosine
from rlpost.diffusion.models.digits._build import with_grad as _with_grad
from rlpost.diffusion.models.digits.data import (
    N_CLASSES,
    N_PIXELS,
    digits_split,
    to_model_space,
)


def sinusoidal_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """``[B, dim]`` sin/cos features of ``t`` ``[B]`` (DDPM / DiT style)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class _ResBlock(nn.Module):
    """``h + W(SiLU(LayerNorm(h) + c))``: a residual block with additive conditioning."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, h: Tensor, c: Tensor) -> Tensor:
        return h + self.fc(F.silu(self.norm(h) + c))


class DigitsVelocityNet(nn.Module):
    """Class-conditional velocity field ``v(x, sigma, labels)`` on 8x8 images.

    An MLP on the 64 flattened pixels: input projection, ``n_blocks`` residual blocks
    (LayerNorm + SiLU + Linear) to which the conditioning ``c = MLP(sin-emb(1000 sigma))
    + Embedding(label)`` is added, then LayerNorm + SiLU + a zero-initialised output
    layer (so ``v = 0`` at initialisation). ~317k parameters with the defaults.

    Args of ``forward``: ``x`` ``[B, 1, 8, 8]`` (model space), ``sigma`` ``[B]`` (or a
    scalar) in [0, 1], ``labels`` ``[B]`` int64; returns ``[B, 1, 8, 8]``.
    """

    def __init__(
        self, hidden: int = 256, n_blocks: int = 3, emb_dim: int = 64, n_classes: int = N_CLASSES
    ):
        super().__init__()
        self.config = {
            "hidden": hidden,
            "n_blocks": n_blocks,
            "emb_dim": emb_dim,
            "n_classes": n_classes,
        }
        self.emb_dim = emb_dim
        self.inp = nn.Linear(N_PIXELS, hidden)
        self.sigma_mlp = nn.Sequential(
            nn.Linear(emb_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden)
        )
        self.label_emb = nn.Embedding(n_classes, hidden)
        self.blocks = nn.ModuleList(_ResBlock(hidden) for _ in range(n_blocks))
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, N_PIXELS)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: Tensor, sigma: Tensor, labels: Tensor) -> Tensor:
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, device=x.device, dtype=x.dtype)
        if sigma.ndim == 0:
            sigma = sigma.expand(b)
        c = self.sigma_mlp(sinusoidal_embedding(sigma * 1000.0, self.emb_dim).to(x.dtype))
        c = c + self.label_emb(labels)
        h = self.inp(x.reshape(b, N_PIXELS))
        for block in self.blocks:
            h = block(h, c)
        return self.out(F.silu(self.out_norm(h))).reshape(x.shape)


def flow_matching_loss(
    net: Callable[[Tensor, Tensor, Tensor], Tensor],
    x0: Tensor,
    labels: Tensor,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Rectified-flow regression ``mean ||v(x_sigma, sigma, y) - (eps - x0)||^2``.

    ``sigma = sigmoid(n)``, ``n ~ N(0, 1)`` (logit-normal, as SD3 pretraining);
    ``x_sigma = (1 - sigma) x0 + sigma eps``. Mean over pixels and batch.
    """
    b = x0.shape[0]
    eps = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    sigma = torch.sigmoid(torch.randn(b, generator=generator, device=x0.device, dtype=x0.dtype))
    s = sigma.view(b, *([1] * (x0.ndim - 1)))
    x_sigma = (1.0 - s) * x0 + s * eps
    return F.mse_loss(net(x_sigma, sigma, labels), eps - x0)


@_with_grad
def train_flow_matching(
    net: DigitsVelocityNet,
    x0: Tensor,
    labels: Tensor,
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    label_noise: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Flow-matching pretraining of ``net`` in place on ``(x0, labels)`` (model space).

    AdamW, gradient norm clipped to 1, linear warmup (5%) then cosine decay to ``lr / 10``;
    each step draws a batch with replacement. With ``label_noise = p`` each example's
    conditioning label is replaced, with probability ``p``, by a uniformly drawn *other*
    class, so the model learns ``p(x | y) = (1 - p) p_data(x | y) + p / 9 sum_{y' != y}
    p_data(x | y')``: clean-looking digits that follow the prompt only ~``1 - p`` of the
    time (an imperfect prompt follower, like real text-to-image bases). Returns the
    per-step training losses and leaves ``net`` in eval mode.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(steps))
    net.train()
    losses: list[float] = []
    bar = tqdm(range(steps), desc="digits flow", disable=not progress, leave=False, file=sys.stderr)
    for _ in bar:
        idx = torch.randint(len(labels), (batch_size,), generator=gen)
        y = labels[idx]
        if label_noise > 0:
            flip = torch.rand(batch_size, generator=gen) < label_noise
            shift = torch.randint(1, N_CLASSES, (batch_size,), generator=gen)
            y = torch.where(flip, (y + shift) % N_CLASSES, y)
        loss = flow_matching_loss(net, x0[idx], y, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress and len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.4f}")
    bar.close()
    net.eval()
    return losses


@torch.no_grad()
def heldout_fm_loss(net: DigitsVelocityNet, repeats: int = 8, seed: int = 1234) -> float:
    """Flow-matching loss on the held-out split, each image ``repeats`` times, fixed noise."""
    split = digits_split()
    x0 = to_model_space(split.heldout_images).repeat(repeats, 1, 1, 1)
    labels = split.heldout_labels.repeat(repeats)
    gen = torch.Generator().manual_seed(seed)
    return flow_matching_loss(net, x0, labels, generator=gen).item()


@torch.no_grad()
def euler_sample(
    velocity: Callable[[Tensor, Tensor, Tensor], Tensor],
    labels: Tensor,
    steps: int = 20,
    generator: torch.Generator | None = None,
    noise: Tensor | None = None,
) -> Tensor:
    """Minimal deterministic Euler ODE sampler (used by the builder and tests).

    Integrates ``dx/dsigma = v`` on ``steps`` uniform steps from ``sigma = 1`` (noise
    ``[B, 1, 8, 8]``, or ``noise`` if given) to ``sigma = 0``; ``velocity(x, sigma[B],
    labels)``. Returns model-space samples (the project's sampler module has the real ones).
    """
    b = labels.shape[0]
    if noise is None:
        noise = torch.randn((b, 1, 8, 8), generator=generator).to(labels.device)
    x = noise
    sigmas = torch.linspace(1.0, 0.0, steps + 1, device=x.device)
    for i in range(steps):
        s = sigmas[i].expand(b)
        x = x + (sigmas[i + 1] - sigmas[i]) * velocity(x, s, labels)
    return x


@_with_grad
def load_digits_net(path: str | os.PathLike) -> DigitsVelocityNet:
    """A :class:`DigitsVelocityNet` from a :func:`build_digits_base` folder (or the
    ``velocity.safetensors`` file itself), in eval mode on CPU."""
    from safetensors.torch import load_file

    file = Path(path)
    if file.is_dir():
        file = file / "velocity.safetensors"
    info = json.loads((file.parent / "base_info.json").read_text())
    net = DigitsVelocityNet(**info["net"])
    net.load_state_dict(load_file(file))
    return net.eval()
