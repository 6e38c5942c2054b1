"""What every robot fine-tuning algorithm shares.

* :class:`ChunkBuffer` / :func:`chunk_transitions`: chunk-level transitions of episodes;
* :func:`evaluate_policy`, :func:`force_stats`: success, return and contact-force metrics;
* :func:`online_loop`: the one online fine-tuning loop. An algorithm supplies a learner
  with ``collect(n, seed)`` (run ``n`` episodes with the current policy, any data it
  needs) and ``update(data)`` (learn from them; returns the round's metrics, including
  ``online_success``); the loop spends the episode budget in rounds of ``envs`` episodes,
  logs one row per round and shows a progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

# ------------------------------------------------------------------ chunk transitions


@dataclass
class ChunkBuffer:
    """Chunk-level transitions ``(s_t, a_{t:t+H}, mask, R, s_{t+k}, discount)``.

    ``R = sum_{i<k} gamma^i r_{t+i}`` over the ``k = min(execute, T - t)`` executed steps and
    ``discount = gamma^k`` (0 when the episode terminated within the chunk), so that
    ``Q(s, a) = R + discount * V(s')``.
    """

    obs: Tensor
    chunks: Tensor
    mask: Tensor
    returns: Tensor
    next_obs: Tensor
    discount: Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        idx = torch.randint(len(self), (n,), generator=generator)
        return {k: getattr(self, k)[idx] for k in self.__dataclass_fields__}

    def extend(self, other: ChunkBuffer) -> ChunkBuffer:
        return ChunkBuffer(
            *(torch.cat([getattr(self, k), getattr(other, k)]) for k in self.__dataclass_fields__)
        )


def chunk_transitions(
    episodes: Sequence[Any], horizon: int, execute: int, gamma: float
) -> ChunkBuffer:
    """Every step ``t`` of every episode as a chunk transition (see :class:`ChunkBuffer`).

    Episodes need ``obs [T+1, D]``, ``actions [T, A]``, ``rewards [T]`` and a ``terminated``
    attribute (True when the last state is terminal, e.g. reached the goal; False when the
    episode was cut by the time limit, whose last state is bootstrapped).
    """
    cols: dict[str, list] = {k: [] for k in ChunkBuffer.__dataclass_fields__}
    for ep in episodes:
        obs, act, rew = (np.asarray(x, dtype=np.float32) for x in (ep.obs, ep.actions, ep.rewards))
        T = len(act)
        terminal = bool(getattr(ep, "terminated", False))
        for t in range(T):
            idx = np.minimum(np.arange(t, t + horizon), T - 1)
            k = min(execute, T - t)
            disc = gamma ** np.arange(k)
            cols["obs"].append(obs[t])
            cols["chunks"].append(act[idx])
            cols["mask"].append((np.arange(t, t + horizon) < T).astype(np.float32))
            cols["returns"].append(np.float32((disc * rew[t : t + k]).sum()))
            cols["next_obs"].append(obs[t + k])
            ends = t + k == T and terminal
            cols["discount"].append(np.float32(0.0 if ends else gamma**k))
    return ChunkBuffer(**{k: torch.as_tensor(np.stack(v)) for k, v in cols.items()})


# ----------------------------------------------------------------------- evaluation


def evaluate_policy(
    policy: Any,
    task: str,
    episodes: int,
    n_steps: int,
    seed: int,
    envs: int = 8,
    execute: int | None = None,
) -> dict[str, float]:
    """Success rate (and return, force metrics) of ``policy`` with ``n_steps`` integration
    steps over ``episodes`` fresh episodes on vectorised envs. ``seed`` fixes the episodes'
    initial states and the policy's sampling noise (not torch's global generator, whose
    state depends on what ran before), so the same policy always scores the same."""
    from rlpost.robot.demos import collect_episodes
    from rlpost.robot.policies.bc import ChunkController

    ctrl = ChunkController(
        policy, execute=execute or policy.cfg.horizon, n_steps=n_steps, seed=seed
    )
    eps = collect_episodes(task, ctrl, n_episodes=episodes, seed=seed, n_envs=min(envs, episodes))
    return {
        "success": float(np.mean([e.success for e in eps])),
        "return": float(np.mean([e.metrics["return"] for e in eps])),
        **force_stats(eps),
    }


def force_stats(episodes: Sequence[Any]) -> dict[str, float]:
    """Mean per-episode peak contact force (N) and fraction of steps above the task's
    force threshold; empty for tasks without force."""
    peaks = [e.metrics.get("peak_force") for e in episodes]
    if not peaks or any(p is None for p in peaks):
        return {}
    return {
        "peak_force": float(np.mean(peaks)),
        "frac_force_above": float(np.mean([e.metrics["frac_force_above"] for e in episodes])),
    }


# ---------------------------------------------------------------------- online loop


class OnlineLearner(Protocol):
    def collect(self, n: int, seed: int) -> Any:
        """Run ``n`` episodes (seeded by ``seed``) with the current policy."""

    def update(self, data: Any) -> dict[str, float]:
        """Learn from one round's data; the round's metrics (``online_success`` ...)."""


def online_loop(
    learner: OnlineLearner,
    episodes: int,
    envs: int,
    seed: int,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    desc: str = "episodes",
) -> list[dict[str, Any]]:
    """Spend ``episodes`` online episodes in rounds of ``envs``: ``collect`` then
    ``update``; returns one row per round (``episodes`` used so far, the learner's
    metrics, ``seconds`` since the start), each also passed to ``log``."""
    from tqdm.auto import tqdm

    history, used, t0 = [], 0, time.perf_counter()
    bar = tqdm(total=episodes, disable=not progress, desc=desc)
    try:
        while used < episodes:
            n = min(envs, episodes - used)
            data = learner.collect(n, seed * 100_003 + used)
            used += n
            row = {"episodes": used, **learner.update(data), "seconds": time.perf_counter() - t0}
            history.append(row)
            if log is not None:
                log(row)
            bar.update(n)
            bar.set_postfix(success=f"{row.get('online_success', float('nan')):.2f}")
    finally:
        bar.close()
    return history


__all__ = [
    "ChunkBuffer",
    "OnlineLearner",
    "chunk_transitions",
    "evaluate_policy",
    "force_stats",
    "online_loop",
]
