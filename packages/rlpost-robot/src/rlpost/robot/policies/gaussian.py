"""Gaussian action-chunk policy: ``pi(a_{t:t+H} | o_t) = N(mu(o_t), diag sigma^2)``.

The policy-gradient methods (CRAFT) need log-probabilities, which a flow policy does not
give cheaply. The mean is an MLP of the standardised observation; ``log sigma`` is a
state-independent parameter per chunk entry. :meth:`sample` returns the mean (clamped to
the action box), so the deterministic policy runs through
:class:`~rlpost.robot.policies.bc.ChunkController` and ``evaluate_policy`` like the others;
:meth:`explore` draws from the Gaussian.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlpost.robot.nets import mlp
from rlpost.robot.policies._io import read_policy, save_policy


class _Cfg:
    def __init__(self, obs_dim: int, act_dim: int, horizon: int, hidden: int, init_std: float):
        self.obs_dim, self.act_dim, self.horizon = obs_dim, act_dim, horizon
        self.hidden, self.init_std = hidden, init_std

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class GaussianChunkPolicy(nn.Module):
    def __init__(
        self, obs_dim: int, act_dim: int, horizon: int = 4, hidden: int = 256, init_std: float = 0.2
    ):
        super().__init__()
        if init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        self.cfg = _Cfg(obs_dim, act_dim, horizon, hidden, init_std)
        self.net = mlp(obs_dim, horizon * act_dim, hidden)
        self.log_std = nn.Parameter(torch.full((horizon, act_dim), float(np.log(init_std))))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))

    @property
    def device(self) -> torch.device:
        return self.obs_mean.device

    def set_normalization(self, obs: Tensor) -> None:
        self.obs_mean.copy_(obs.mean(0))
        self.obs_std.copy_(obs.std(0).clamp_min(1e-3))

    def mean(self, obs: Tensor) -> Tensor:
        h = self.net((obs - self.obs_mean) / self.obs_std)
        return h.view(-1, self.cfg.horizon, self.cfg.act_dim)

    def log_prob(self, obs: Tensor, chunks: Tensor, mean: Tensor | None = None) -> Tensor:
        """``log pi(chunks | obs)``: ``chunks [B, H, A]`` or ``[B, G, H, A]`` -> ``[B]`` / ``[B, G]``."""
        mu = self.mean(obs) if mean is None else mean
        if chunks.dim() == 4:
            mu = mu[:, None]
        z = (chunks - mu) / self.log_std.exp()
        lp = -0.5 * z**2 - self.log_std - 0.5 * float(np.log(2 * np.pi))
        return lp.flatten(-2).sum(-1)

    @torch.no_grad()
    def explore(self, obs: Tensor, n: int = 1, generator: torch.Generator | None = None) -> Tensor:
        """``n`` chunks per state from the Gaussian: ``[B, n, H, A]`` (not clamped)."""
        mu = self.mean(obs)[:, None]
        eps = torch.randn((mu.shape[0], n, *mu.shape[2:]), generator=generator)
        return mu + self.log_std.exp() * eps

    @torch.no_grad()
    def sample(self, obs: Tensor, **_: Any) -> Tensor:
        """The mean chunk, clamped to ``[-1, 1]`` (deterministic execution)."""
        return self.mean(obs).clamp(-1, 1)

    # ------------------------------------------------------------------ persistence
    def save(self, path_dir: str | Path) -> Path:
        """``model.safetensors`` + ``config.json`` (kind ``gaussian``)."""
        return save_policy(self, path_dir, {"kind": "gaussian", **self.cfg.to_dict()})

    @classmethod
    def load(cls, path_dir: str | Path) -> GaussianChunkPolicy:
        """Rebuild from :meth:`save`'s folder (safetensors + JSON only, no pickle)."""
        meta, state = read_policy(path_dir, "gaussian")
        pi = cls(**meta)
        pi.load_state_dict(state, strict=True)
        return pi.eval()


def train_gaussian_bc(
    policy: GaussianChunkPolicy,
    obs: Tensor,
    chunks: Tensor,
    mask: Tensor,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> list[float]:
    """Behaviour cloning of the mean (masked squared error); ``log_std`` is left at its
    initial value (the exploration scale of the RL phase)."""
    g = torch.Generator().manual_seed(seed)
    policy.set_normalization(obs)
    opt = torch.optim.Adam(policy.net.parameters(), lr=lr)
    m = mask.float()[..., None]
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(obs), (batch_size,), generator=g)
        err = (policy.mean(obs[idx]) - chunks[idx]) ** 2 * m[idx]
        loss = err.sum() / (m[idx].sum() * chunks.shape[-1]).clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
