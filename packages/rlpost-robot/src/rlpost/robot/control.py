"""``rlpost-robot control``: GRPO-family policy gradients on a gymnasium MuJoCo task from
scratch, with any core preset (Pair-GRPO's control experiment, catalog 001-14b).

Soft-Pair-GRPO's abstract reports HalfCheetah besides language alignment: it replaces
GRPO's group-normalised scalar rewards with binary pairwise preferences inside the group
and keeps GRPO's clipped surrogate and KL. Here both are the core's presets
(``rlpost.core.get_preset("grpo")`` / ``"soft_pair_grpo"``), so the comparison changes one
registry entry, the advantage, and nothing else:

* a group is ``group_size`` rollouts of ``horizon`` steps from the *same* initial state (the
  environment reset with the same seed), ``starts`` groups per iteration;
* the reward of a rollout is its return; the preset's advantage estimator turns the
  group's returns into one advantage per rollout, given to every step (a step is a
  "token": ``log pi(a_t | s_t)`` of the Gaussian policy);
* the preset's policy loss (PPO clip 0.2, sequence-mean aggregation, the preset's ``k3``
  KL to the initial policy unless ``kl_coef`` overrides its weight) over ``epochs`` passes
  of whole-group minibatches.

The policy is a Gaussian MLP (tanh hidden layers, state-independent log-std) over
observations standardised by running statistics (frozen within an iteration). The
evaluation return is the mean action's, over fixed seeds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["GaussianMLP", "format_control", "run_control"]


class GaussianMLP(nn.Module):
    """``pi(a | s) = N(mu(s), diag exp(log_std)^2)`` over standardised observations."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 64, init_std: float = 0.5):
        super().__init__()
        self.mu = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, act_dim),
        )  # fmt: skip
        nn.init.zeros_(self.mu[-1].bias)
        self.mu[-1].weight.data.mul_(0.01)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(np.log(init_std))))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_var", torch.ones(obs_dim))
        self.register_buffer("obs_count", torch.tensor(1e-4))

    @torch.no_grad()
    def update_normalization(self, obs: Tensor) -> None:
        """Merge ``obs [N, D]`` into the running mean / variance (parallel update)."""
        n = obs.shape[0]
        mean, var = obs.mean(0), obs.var(0, unbiased=False)
        tot = self.obs_count + n
        delta = mean - self.obs_mean
        self.obs_mean += delta * n / tot
        self.obs_var.copy_(
            (self.obs_var * self.obs_count + var * n + delta**2 * self.obs_count * n / tot) / tot
        )
        self.obs_count.copy_(tot)

    def mean(self, obs: Tensor) -> Tensor:
        z = ((obs - self.obs_mean) / self.obs_var.sqrt().clamp_min(1e-6)).clamp(-10, 10)
        return self.mu(z)

    def log_prob(self, obs: Tensor, act: Tensor) -> Tensor:
        """``log pi(act | obs)`` summed over action dimensions: ``[...]``."""
        mu, log_std = self.mean(obs), self.log_std
        z = (act - mu) / log_std.exp()
        return (-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)


def _rollouts(env: Any, policy: GaussianMLP, seeds: list[int], horizon: int, gen: torch.Generator):
    """Roll out ``len(seeds)`` envs (env ``i`` reset with ``seeds[i]``) for ``horizon``
    steps, sampling from the policy: obs ``[B, T, D]``, actions ``[B, T, A]``, log-probs
    ``[B, T]``, rewards ``[B, T]``."""
    obs, _ = env.reset(seed=seeds)
    o, a, lp, r = [], [], [], []
    with torch.no_grad():
        for _ in range(horizon):
            x = torch.as_tensor(obs, dtype=torch.float32)
            mu = policy.mean(x)
            act = mu + policy.log_std.exp() * torch.randn(mu.shape, generator=gen)
            o.append(x)
            a.append(act)
            lp.append(policy.log_prob(x, act))
            obs, rew, _, _, _ = env.step(act.numpy())
            r.append(torch.as_tensor(rew, dtype=torch.float32))
    return torch.stack(o, 1), torch.stack(a, 1), torch.stack(lp, 1), torch.stack(r, 1)


def evaluate(env_id: str, policy: GaussianMLP, episodes: int, horizon: int, seed: int) -> float:
    """Mean return of the mean action over ``episodes`` rollouts of ``horizon`` steps."""
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * episodes)
    obs, _ = env.reset(seed=[seed + i for i in range(episodes)])
    total = np.zeros(episodes)
    with torch.no_grad():
        for _ in range(horizon):
            act = policy.mean(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            obs, rew, _, _, _ = env.step(act)
            total += rew
    env.close()
    return float(total.mean())


def run_control(job: Any, overwrite: bool = False, log: Any = None) -> dict[str, Any]:
    """Train a Gaussian policy with ``job.preset`` on ``job.env_id``; see the module
    docstring. Writes ``metrics.jsonl``, ``control.json``, ``returns.png``, ``policy/``."""
    import gymnasium as gym
    from safetensors.torch import save_model

    from rlpost.core import AdvantageInput, PolicyBatch
    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.core.io.rundir import open_run_dir
    from rlpost.robot.config import control_preset

    if job.run.threads:
        torch.set_num_threads(job.run.threads)
    out = open_run_dir(job.run.dir, job, overwrite=overwrite)
    _mujoco_warnings_to_python()
    torch.manual_seed(job.run.seed)
    gen = torch.Generator().manual_seed(job.run.seed)
    rng = np.random.default_rng(job.run.seed)
    recipe = control_preset(job).build()
    n = job.starts * job.group_size
    env = gym.vector.SyncVectorEnv([lambda: gym.make(job.env_id)] * n)
    obs_dim = env.single_observation_space.shape[0]
    act_dim = env.single_action_space.shape[0]
    policy = GaussianMLP(obs_dim, act_dim, job.hidden, job.init_std)
    ref = GaussianMLP(obs_dim, act_dim, job.hidden, job.init_std)
    ref.load_state_dict(policy.state_dict())
    opt = torch.optim.Adam(policy.parameters(), lr=job.lr)
    groups = torch.arange(job.starts).repeat_interleave(job.group_size)
    logger = MetricsLogger.for_run(out, job.run)
    history = []
    t0 = time.perf_counter()
    from tqdm.auto import tqdm

    bar = tqdm(range(job.iterations), disable=not job.run.progress, desc=f"{job.preset}")
    try:
        for it in bar:
            starts = rng.integers(0, 2**31 - 1, job.starts).tolist()
            seeds = [s for s in starts for _ in range(job.group_size)]  # same start per group
            obs, act, old, rew = _rollouts(env, policy, seeds, job.horizon, gen)
            returns = rew.sum(1)
            mask = torch.ones(n, job.horizon)
            adv = recipe.advantages(AdvantageInput(returns, groups, mask)).advantages
            with torch.no_grad():
                ref_lp = ref.log_prob(obs, act)
            m: dict[str, float] = {}
            for _ in range(job.epochs):
                for g in torch.randperm(job.starts, generator=gen).split(job.groups_per_batch):
                    rows = (groups[:, None] == g[None]).any(1)
                    lp = policy.log_prob(obs[rows], act[rows])
                    loss = recipe.policy_loss(
                        PolicyBatch(
                            lp, old[rows], adv[rows], mask[rows], ref_logp=ref_lp[rows],
                            group_ids=groups[rows], global_tokens=float(mask[rows].sum()),
                            global_sequences=float(rows.sum()),
                        )
                    )  # fmt: skip
                    opt.zero_grad()
                    loss.loss.backward()
                    nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
                    opt.step()
                    for k, v in loss.metrics.items():
                        m[k] = v
            policy.update_normalization(obs.reshape(-1, obs_dim))
            ref.load_state_dict({**ref.state_dict(), **_norm(policy)})
            row = {
                "iteration": it + 1,
                "env_steps": (it + 1) * n * job.horizon,
                "return": float(returns.mean()),
                "return_max": float(returns.max()),
                "std": float(policy.log_std.detach().exp().mean()),
                **{k: float(v) for k, v in m.items() if isinstance(v, int | float)},
                "seconds": time.perf_counter() - t0,
            }
            if job.eval_every and ((it + 1) % job.eval_every == 0 or it + 1 == job.iterations):
                row["eval_return"] = evaluate(
                    job.env_id, policy, job.eval_episodes, job.horizon, 10_000
                )
            history.append(row)
            logger.log(it + 1, row)
            if log is not None:
                log(row)
            bar.set_postfix(ret=f"{row['return']:.1f}")
    finally:
        logger.close()
        env.close()
    (out / "policy").mkdir(exist_ok=True)
    save_model(policy, str(out / "policy" / "model.safetensors"))
    evals = [h["eval_return"] for h in history if "eval_return" in h]
    result = {
        "env_id": job.env_id,
        "preset": job.preset,
        "iterations": job.iterations,
        "env_steps": history[-1]["env_steps"] if history else 0,
        "final_eval_return": evals[-1] if evals else None,
        "best_eval_return": max(evals) if evals else None,
        "history": history,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "control.json").write_text(json.dumps(result, indent=1))
    _plot(result, out / "returns.png")
    return result


def _mujoco_warnings_to_python() -> None:
    """MuJoCo's own warning handler prints each warning and appends it to
    ``MUJOCO_LOG.TXT`` in the working directory (gymnasium's HalfCheetah model raises a
    deprecation warning per environment built); route them to :mod:`warnings` instead,
    whose default filter shows a repeated warning once. The deprecation of
    ``settotalmass`` in gymnasium's own model files is dropped: a user cannot act on it
    (it printed twice per run). The handler is process-wide and stays set."""
    import warnings

    import mujoco

    def warn(msg: str) -> None:
        if "'settotalmass' is deprecated" in msg:
            return
        warnings.warn(f"mujoco: {msg.strip()}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(warn)


def _norm(policy: GaussianMLP) -> dict[str, Tensor]:
    """The normalisation buffers: the reference policy shares them (same inputs)."""
    return {k: v.clone() for k, v in policy.state_dict().items() if k.startswith("obs_")}


def format_control(r: dict[str, Any]) -> str:
    return (
        f"{r['preset']} on {r['env_id']}: {r['iterations']} iterations, {r['env_steps']} env "
        f"steps; evaluation return (mean action) final {r['final_eval_return']:.1f}, best "
        f"{r['best_eval_return']:.1f}; {r['seconds']} s"
    )


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = r["history"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([x["env_steps"] for x in h], [x["return"] for x in h], label="sampled rollouts")
    ev = [x for x in h if "eval_return" in x]
    ax.plot([x["env_steps"] for x in ev], [x["eval_return"] for x in ev], "o-", label="mean action")
    ax.set(xlabel="environment steps", ylabel="return", title=f"{r['preset']} on {r['env_id']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
