"""Flow-matching action-chunk policy: ``pi(a_{t:t+H} | o_t)`` as a rectified flow.

Convention (the same as ``rlpost.diffusion``): ``sigma = 1`` is noise, ``sigma = 0`` data,

* forward process ``a_sigma = (1 - sigma) a + sigma eps``, ``eps ~ N(0, I)``;
* the network predicts the velocity ``v(o, a_sigma, sigma) ~ u = eps - a = d a_sigma / d sigma``;
* sampling integrates ``da/dsigma = v`` from ``sigma = 1`` to ``0`` with Euler steps on the
  uniform grid ``1, 1 - 1/n, ..., 0``: ``a <- a + (sigma_next - sigma) v``.

The flow runs in raw action units (``act_low`` / ``act_high`` only clamp the sample), so
actions should be roughly unit-scale, as the unit-variance noise assumes. Observations
are standardised by buffers (:meth:`FlowChunkPolicy.set_normalization`) that travel with
the weights.

A one-step Euler sample is ``eps - v(o, eps, 1) = E[a | o]``: for a multimodal action
distribution it collapses onto the mean of the modes. More steps follow the curved flow;
straightening it (OTQL) is what makes few steps sufficient.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

Bound = float | tuple[float, ...] | None


def _floats(x: Any) -> tuple[float, ...] | None:
    if x is None:
        return None
    return tuple(float(v) for v in (x.tolist() if hasattr(x, "tolist") else x))


def _bound(x: Any) -> Bound:
    if x is None or isinstance(x, int | float):
        return None if x is None else float(x)
    return _floats(x)


@dataclasses.dataclass(frozen=True)
class FlowPolicyConfig:
    """Architecture and data conventions of a :class:`FlowChunkPolicy` (JSON-serialisable).

    ``obs_mean`` / ``obs_std``: initial observation normalisation (``None``: identity);
    ``act_low`` / ``act_high``: sample clamp, a float, one per action dim, or ``None``;
    ``n_steps``: default Euler steps of :meth:`FlowChunkPolicy.sample`;
    ``time_dim``: width of the sinusoidal ``sigma`` embedding.
    """

    obs_dim: int
    act_dim: int
    horizon: int = 8
    hidden: int = 256
    n_blocks: int = 3
    n_steps: int = 10
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None
    act_low: Bound = -1.0
    act_high: Bound = 1.0
    time_dim: int = 32
    image_shape: tuple[int, int, int] | None = None
    """``(H, W, C)``: the last ``H W C`` observation entries are an image (0-255)."""
    state_idx: tuple[int, ...] | None = None
    """State entries the policy conditions on (``None``: all of them)."""
    image_features: int = 64

    def __post_init__(self) -> None:
        for name in ("image_shape", "state_idx"):
            v = getattr(self, name)
            object.__setattr__(self, name, None if v is None else tuple(int(x) for x in v))
        if self.image_shape is not None and (
            len(self.image_shape) != 3 or self.n_pixels >= self.obs_dim
        ):
            raise ValueError(f"image_shape {self.image_shape} does not fit obs_dim {self.obs_dim}")
        if self.state_idx is not None and any(not 0 <= i < self.state_dim for i in self.state_idx):
            raise ValueError(f"state_idx must index the {self.state_dim} state entries")
        for name in ("obs_mean", "obs_std"):
            object.__setattr__(self, name, _floats(getattr(self, name)))
        for name in ("act_low", "act_high"):
            object.__setattr__(self, name, _bound(getattr(self, name)))
        for name in ("obs_dim", "act_dim", "horizon", "hidden", "n_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_blocks < 0 or self.time_dim < 2 or self.time_dim % 2:
            raise ValueError("n_blocks must be >= 0 and time_dim even and >= 2")
        for name in ("obs_mean", "obs_std"):
            v = getattr(self, name)
            if v is not None and len(v) != self.obs_dim:
                raise ValueError(f"{name} has {len(v)} entries, obs_dim is {self.obs_dim}")
        for name in ("act_low", "act_high"):
            v = getattr(self, name)
            if isinstance(v, tuple) and len(v) != self.act_dim:
                raise ValueError(f"{name} has {len(v)} entries, act_dim is {self.act_dim}")

    @property
    def n_pixels(self) -> int:
        return 0 if self.image_shape is None else math.prod(self.image_shape)

    @property
    def state_dim(self) -> int:
        """Observation entries before the image."""
        return self.obs_dim - self.n_pixels

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (tuples become lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlowPolicyConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``TypeError``."""
        return cls(**d)


def sinusoidal(sigma: Tensor, dim: int, max_freq: float = 1000.0) -> Tensor:
    """``[sin(f_k sigma), cos(f_k sigma)]`` with ``f_k`` geometric in ``[1, max_freq]``: ``[B, dim]``."""
    half = dim // 2
    freqs = torch.exp(
        torch.linspace(0.0, math.log(max_freq), half, device=sigma.device, dtype=sigma.dtype)
    )
    arg = sigma[:, None] * freqs
    return torch.cat([arg.sin(), arg.cos()], dim=1)


class _Block(nn.Module):
    """Pre-LayerNorm residual layer ``x + SiLU(W LN(x) + b)`` (one matmul: CPU-cheap)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU())

    def forward(self, x: Tensor) -> Tensor:
        return x + self.net(x)


def _bound_buffer(b: Bound, act_dim: int, default: float) -> Tensor:
    if b is None:
        return torch.full((act_dim,), default)
    return torch.as_tensor(b, dtype=torch.float32).expand(act_dim).clone()


class ImageEncoder(nn.Module):
    """Small CNN: ``[B, H, W, C]`` pixels (0-255) -> ``[B, features]``. Three stride-2
    3x3 convolutions (16, 32, 32 channels) with SiLU, flattened, one linear layer."""

    def __init__(self, shape: tuple[int, int, int], features: int) -> None:
        super().__init__()
        h, w, c = shape
        self.shape = shape
        self.conv = nn.Sequential(
            nn.Conv2d(c, 16, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1),
            nn.SiLU(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).numel()
        self.proj = nn.Sequential(nn.Flatten(), nn.Linear(n, features), nn.SiLU())

    def forward(self, pixels: Tensor) -> Tensor:
        x = pixels.reshape(-1, *self.shape).permute(0, 3, 1, 2) / 255.0 - 0.5
        return self.proj(self.conv(x))


class FlowChunkPolicy(nn.Module):
    """Residual MLP velocity field over ``[condition, flat a_sigma, sinusoidal(sigma)]``.

    The condition is the normalised observation (the ``state_idx`` entries when set) and,
    with ``image_shape``, the :class:`ImageEncoder` features of the image carried in the
    observation's last entries. The output layer is zero-initialised, so a fresh policy
    has ``v = 0`` and samples its (clamped) noise.
    """

    def __init__(self, cfg: FlowPolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_state = cfg.state_dim if cfg.state_idx is None else len(cfg.state_idx)
        self.image = None
        if cfg.image_shape is not None:
            self.image = ImageEncoder(cfg.image_shape, cfg.image_features)
            n_state += cfg.image_features
        d_in = n_state + cfg.horizon * cfg.act_dim + cfg.time_dim
        self.inp = nn.Linear(d_in, cfg.hidden)
        self.blocks = nn.Sequential(*[_Block(cfg.hidden) for _ in range(cfg.n_blocks)])
        self.out = nn.Sequential(
            nn.LayerNorm(cfg.hidden), nn.SiLU(), nn.Linear(cfg.hidden, cfg.horizon * cfg.act_dim)
        )
        nn.init.zeros_(self.out[-1].weight)
        nn.init.zeros_(self.out[-1].bias)
        self.register_buffer("obs_mean", torch.zeros(cfg.obs_dim))
        self.register_buffer("obs_std", torch.ones(cfg.obs_dim))
        self.register_buffer("act_low", _bound_buffer(cfg.act_low, cfg.act_dim, -math.inf), False)
        self.register_buffer("act_high", _bound_buffer(cfg.act_high, cfg.act_dim, math.inf), False)
        if cfg.obs_mean is not None or cfg.obs_std is not None:
            self.set_normalization(cfg.obs_mean, cfg.obs_std)

    # ------------------------------------------------------------------ normalisation

    @property
    def device(self) -> torch.device:
        return self.obs_mean.device

    @torch.no_grad()
    def set_normalization(
        self, obs_mean: Sequence[float] | Tensor | None, obs_std: Sequence[float] | Tensor | None
    ) -> None:
        """Set the observation standardisation ``(o - mean) / std`` (``None``: 0 / 1).

        Stds below ``1e-6`` (constant features) become 1. ``cfg`` is updated to match,
        so :meth:`save` writes a consistent ``config.json``.
        """
        mean = torch.zeros(self.cfg.obs_dim) if obs_mean is None else torch.as_tensor(obs_mean)
        std = torch.ones(self.cfg.obs_dim) if obs_std is None else torch.as_tensor(obs_std)
        mean, std = mean.float().reshape(-1).cpu(), std.float().reshape(-1).cpu()
        if mean.numel() != self.cfg.obs_dim or std.numel() != self.cfg.obs_dim:
            raise ValueError(f"normalisation must have obs_dim={self.cfg.obs_dim} entries")
        std = torch.where(std < 1e-6, torch.ones_like(std), std)
        self.obs_mean.copy_(mean)
        self.obs_std.copy_(std)
        self.cfg = dataclasses.replace(
            self.cfg, obs_mean=tuple(mean.tolist()), obs_std=tuple(std.tolist())
        )

    def normalize_obs(self, obs: Tensor) -> Tensor:
        return (obs - self.obs_mean) / self.obs_std

    # ------------------------------------------------------------------ model

    def condition(self, obs: Tensor) -> Tensor:
        """The observation features the velocity field is conditioned on ``[B, F]``."""
        cfg = self.cfg
        sd = cfg.state_dim
        state = (obs[:, :sd] - self.obs_mean[:sd]) / self.obs_std[:sd]
        if cfg.state_idx is not None:
            state = state[:, list(cfg.state_idx)]
        if self.image is None:
            return state
        return torch.cat([state, self.image(obs[:, sd:])], dim=1)

    def velocity(
        self, obs: Tensor, a_sigma: Tensor, sigma: Tensor | float, cond: Tensor | None = None
    ) -> Tensor:
        """``v(o, a_sigma, sigma)``: obs ``[B, D]``, a_sigma ``[B, H, A]``, sigma ``[B]`` or
        scalar; ``cond`` (:meth:`condition` of ``obs``) skips recomputing the features."""
        b = a_sigma.shape[0]
        sigma = torch.as_tensor(sigma, dtype=a_sigma.dtype, device=a_sigma.device).expand(b)
        c = self.condition(obs) if cond is None else cond
        x = torch.cat(
            [c.to(a_sigma.dtype), a_sigma.reshape(b, -1), sinusoidal(sigma, self.cfg.time_dim)],
            dim=1,
        )
        return self.out(self.blocks(self.inp(x))).view_as(a_sigma)

    def integrate(self, obs: Tensor, noise: Tensor, n_steps: int | None = None) -> Tensor:
        """Euler-integrate from ``noise`` (sigma = 1) to sigma = 0; differentiable, unclamped."""
        n = self.cfg.n_steps if n_steps is None else int(n_steps)
        if n < 1:
            raise ValueError(f"n_steps must be >= 1, got {n}")
        sigmas = torch.linspace(1.0, 0.0, n + 1, device=noise.device, dtype=noise.dtype)
        x, cond = noise, self.condition(obs)
        for i in range(n):
            x = x + (sigmas[i + 1] - sigmas[i]) * self.velocity(obs, x, sigmas[i], cond)
        return x

    @torch.no_grad()
    def sample(
        self,
        obs: Tensor,
        n_steps: int | None = None,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample chunks ``[B, H, A]`` with ``n_steps`` Euler steps (default ``cfg.n_steps``),
        clamped to ``[act_low, act_high]``; ``noise`` ``[B, H, A]`` fixes the start."""
        shape = (obs.shape[0], self.cfg.horizon, self.cfg.act_dim)
        if noise is None:
            dtype = self.inp.weight.dtype
            noise = torch.randn(shape, generator=generator, device=obs.device, dtype=dtype)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {shape}")
        a = self.integrate(obs, noise, n_steps)
        return torch.maximum(torch.minimum(a, self.act_high), self.act_low)

    def flow_loss(
        self,
        obs: Tensor,
        chunks: Tensor,
        weights: Tensor | None = None,
        noise: Tensor | None = None,
        sigma: Tensor | float | None = None,
        mask: Tensor | None = None,
        generator: torch.Generator | None = None,
        reduce: Literal["mean", "none"] = "mean",
    ) -> Tensor:
        """(Weighted) conditional flow-matching loss ``|v(o, a_sigma, sigma) - (eps - a)|^2``.

        Each sample's loss is the mean over its valid elements (``mask`` ``[B, H]`` drops
        padded chunk steps; a sample with none valid has loss 0). ``weights`` ``[B]`` are
        detached per-sample multipliers, not renormalised, so the batch loss
        ``mean_b(w_b l_b)`` is invariant to micro-batching (size-weighted). ``noise``
        ``[B, H, A]`` and ``sigma`` (``[B]`` or scalar) default to ``N(0, I)`` and ``U(0, 1)``.
        ``reduce="none"`` returns the weighted per-sample losses ``[B]``.
        """
        b = chunks.shape[0]
        if noise is None:
            noise = torch.randn(
                chunks.shape, generator=generator, device=chunks.device, dtype=chunks.dtype
            )
        if sigma is None:
            sigma = torch.rand(b, generator=generator, device=chunks.device, dtype=chunks.dtype)
        sigma = torch.as_tensor(sigma, dtype=chunks.dtype, device=chunks.device).expand(b)
        s = sigma.view(b, 1, 1)
        a_sigma = (1 - s) * chunks + s * noise
        err = (self.velocity(obs, a_sigma, sigma) - (noise - chunks)).pow(2).mean(dim=2)  # [B, H]
        if mask is None:
            per = err.mean(dim=1)
        else:
            m = mask.to(err.dtype).reshape(err.shape)
            per = (err * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
        if weights is not None:
            per = per * weights.detach().to(per.dtype).reshape(b)
        if reduce == "none":
            return per
        if reduce != "mean":
            raise ValueError(f"reduce must be 'mean' or 'none', got {reduce!r}")
        return per.mean()

    # ------------------------------------------------------------------ I/O

    def save(self, path_dir: str | Path) -> Path:
        """Write ``model.safetensors`` (weights + normalisation) and ``config.json``."""
        from rlpost.robot.policies._io import save_policy

        return save_policy(self, path_dir, {"kind": "flow", **self.cfg.to_dict()})

    @classmethod
    def load(cls, path_dir: str | Path, device: str | torch.device = "cpu") -> FlowChunkPolicy:
        """Rebuild from :meth:`save`'s folder (safetensors + JSON only, no pickle)."""
        from rlpost.robot.policies._io import read_policy

        meta, state = read_policy(path_dir, "flow")
        pi = cls(FlowPolicyConfig.from_dict(meta))
        pi.load_state_dict(state, strict=True)
        return pi.to(device)
