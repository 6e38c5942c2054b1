"""Behaviour cloning of a :class:`~rlpost.robot.policies.flow.FlowChunkPolicy` and its
receding-horizon controller.

* :func:`make_chunks` turns episodes into ``(obs_t, a_{t:t+H}, mask)`` samples;
* :func:`train_bc` fits the policy with the (optionally weighted) flow-matching loss;
* :class:`ChunkController` executes the first ``execute`` actions of each sampled chunk,
  per environment of a vector env.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlpost.robot.policies.flow import FlowChunkPolicy


def _field(ep: Any, name: str) -> np.ndarray:
    v = ep[name] if isinstance(ep, dict) else getattr(ep, name)
    return np.asarray(v, dtype=np.float32)


def make_chunks(episodes: Iterable[Any], horizon: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """One sample per step ``t`` of every episode: ``obs[t]`` and ``actions[t:t+H]``.

    Episodes have ``.obs`` ``[T+1, D]`` (or ``[T, D]``) and ``.actions`` ``[T, A]``
    (attributes or dict keys). Chunks running past the episode end repeat its last
    action; ``mask`` marks the real steps. Returns float32 ``obs [N, D]``, float32
    ``chunks [N, H, A]`` and bool ``mask [N, H]`` tensors (``N = sum T``).
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    obs_out, chunk_out, mask_out = [], [], []
    k = np.arange(horizon)
    for ep in episodes:
        obs, act = _field(ep, "obs"), _field(ep, "actions")
        t_len = len(act)
        if t_len == 0:
            continue
        if len(obs) < t_len:
            raise ValueError(f"episode has {len(obs)} observations for {t_len} actions")
        idx = np.arange(t_len)[:, None] + k[None, :]  # [T, H]
        obs_out.append(obs[:t_len])
        chunk_out.append(act[np.minimum(idx, t_len - 1)])
        mask_out.append(idx < t_len)
    if not obs_out:
        raise ValueError("no steps in the episodes")
    return (
        torch.from_numpy(np.concatenate(obs_out)),
        torch.from_numpy(np.concatenate(chunk_out)),
        torch.from_numpy(np.concatenate(mask_out)),
    )


def train_bc(
    policy: FlowChunkPolicy,
    obs: Tensor | np.ndarray,
    chunks: Tensor | np.ndarray,
    mask: Tensor | np.ndarray | None = None,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float = 1e-3,
    weights: Tensor | np.ndarray | None = None,
    seed: int = 0,
    progress: bool = True,
    weight_decay: float = 1e-4,
    grad_clip: float = 1.0,
    normalize: bool = True,
) -> list[float]:
    """Fit ``policy`` by flow matching on ``(obs, chunks, mask)``; returns per-step losses.

    AdamW with a cosine decay of ``lr`` to 0 over ``steps``; minibatches are drawn with
    replacement from a generator seeded by ``seed`` (which also draws the noise and
    sigmas). ``weights`` ``[N]``: per-sample loss multipliers (advantage weighting).
    ``normalize``: first set the policy's observation normalisation from ``obs``.
    """
    dev = policy.device
    obs_t = torch.as_tensor(obs, dtype=torch.float32)
    chunks_t = torch.as_tensor(chunks, dtype=torch.float32)
    n = obs_t.shape[0]
    if chunks_t.shape[0] != n:
        raise ValueError(f"{n} observations but {chunks_t.shape[0]} chunks")
    if normalize:
        o64 = obs_t.double()
        policy.set_normalization(o64.mean(0), o64.std(0, unbiased=False))
    obs_t, chunks_t = obs_t.to(dev), chunks_t.to(dev)
    mask_t = None if mask is None else torch.as_tensor(mask).bool().to(dev)
    w_t = None if weights is None else torch.as_tensor(weights, dtype=torch.float32).to(dev)

    g_idx = torch.Generator().manual_seed(seed)
    g_dev = torch.Generator(device=dev).manual_seed(seed + 1)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, steps) / max(steps, 1)))
    )
    it: Iterable[int] = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="bc", leave=False)
    losses: list[float] = []
    policy.train()
    for _ in it:
        idx = torch.randint(n, (batch_size,), generator=g_idx).to(dev)
        loss = policy.flow_loss(
            obs_t[idx],
            chunks_t[idx],
            weights=None if w_t is None else w_t[idx],
            mask=None if mask_t is None else mask_t[idx],
            generator=g_dev,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress and len(losses) % 50 == 0:
            it.set_postfix(loss=f"{losses[-1]:.4f}")  # type: ignore[attr-defined]
    policy.eval()
    return losses


class ChunkController:
    """Receding-horizon control: sample a chunk, execute its first ``execute`` actions,
    resample.

    Keeps one action queue per environment: :meth:`act` takes ``obs [N, D]`` and samples
    (in one ``policy.sample`` call) only for the envs whose queue is empty; ``__call__``
    takes a single ``obs [D]`` (or a batch). A change of ``N`` resets every queue.
    ``seed`` makes the sampling noise reproducible.
    """

    def __init__(
        self,
        policy: FlowChunkPolicy,
        execute: int = 4,
        n_steps: int | None = None,
        seed: int | None = None,
    ) -> None:
        if not 1 <= execute <= policy.cfg.horizon:
            raise ValueError(f"execute must be in [1, horizon={policy.cfg.horizon}]")
        self.policy, self.execute, self.n_steps = policy, execute, n_steps
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self._plan: np.ndarray | None = None  # [N, H, A]
        self._next = np.zeros(0, dtype=np.int64)  # [N] queue position; >= execute: resample

    def reset(self, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Empty the queues of ``env_ids`` (all when ``None``) so their next action resamples."""
        if env_ids is None:
            self._plan, self._next = None, np.zeros(0, dtype=np.int64)
        elif self._plan is not None:
            self._next[np.asarray(env_ids)] = self.execute

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Next action of every env: ``obs [N, D]`` -> ``[N, A]``."""
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2:
            raise ValueError(f"act expects obs [N, D], got shape {obs.shape}")
        n = len(obs)
        if self._plan is None or len(self._plan) != n:
            cfg = self.policy.cfg
            self._plan = np.zeros((n, cfg.horizon, cfg.act_dim), dtype=np.float32)
            self._next = np.full(n, self.execute, dtype=np.int64)
        need = self._next >= self.execute
        if need.any():
            o = torch.from_numpy(obs[need]).to(self.policy.device)
            chunk = self.policy.sample(o, n_steps=self.n_steps, generator=self.generator)
            self._plan[need] = chunk.float().cpu().numpy()
            self._next[need] = 0
        out = self._plan[np.arange(n), self._next].copy()
        self._next += 1
        return out

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """``obs [D]`` -> action ``[A]`` (a batch ``[N, D]`` goes to :meth:`act`)."""
        obs = np.asarray(obs, dtype=np.float32)
        return self.act(obs[None])[0] if obs.ndim == 1 else self.act(obs)
