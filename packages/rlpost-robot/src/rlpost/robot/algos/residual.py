"""Offline residual RL correction of a base decoder's trajectories (catalog 004-03).

A base decoder (the paper: a CNN-LSTM reading EEG) predicts a 3-D kinematic trajectory
with systematic residual errors. A second-stage RL agent, trained offline and *without the
decoder's input*, reads a window of the predicted trajectory and outputs a bounded
correction ``delta_t`` so that ``y_t = p_t + delta_t`` tracks the target. Metrics: Pearson
correlation ``r`` and RMSE per axis.

Our construction (no public code):

* **Data** (:func:`synthetic_decoding_data`): smooth random target trajectories and the
  predictions of an imperfect decoder with the error structure such decoders show:
  amplitude attenuation, temporal lag, per-axis offset, a slow drift and white noise.
* **MDP**: state = the last ``window`` predictions (and their differences); action =
  ``delta_t`` in ``[-max_delta, max_delta]^3``; reward = ``-||p_t + delta_t - x_t||^2``.
  The reward needs the target, so it exists only offline, as in the paper.
* **Agent**: an offline deterministic actor-critic (TD3-style twin critics, gamma = 0:
  the correction does not change future predictions). The critics regress the reward of
  dataset states paired with exploratory actions (Gaussian around the actor's action and
  uniform over the box); the actor ascends ``min(Q1, Q2)``.

:func:`supervised_residual` is the obvious alternative (regress ``x_t - p_t`` directly);
the benchmark reports both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpost.robot.algos.base import check_ranges
from rlpost.robot.nets import mlp

# ------------------------------------------------------------------------------ data


@dataclass
class DecodingData:
    target: Tensor  # [N, T, 3]
    pred: Tensor  # [N, T, 3] the base decoder's trajectories


def synthetic_decoding_data(
    n: int = 64, T: int = 200, dims: int = 3, seed: int = 0, dt: float = 0.02
) -> DecodingData:
    """Targets: sums of 3 random sinusoids (0.2-1.5 Hz) per axis, unit-ish amplitude.
    Predictions: ``0.6 x(t - 8 steps) + offset + slow drift + 0.15 noise`` (attenuated,
    lagging, biased, drifting, noisy, as a recurrent EEG decoder's output tends to be)."""
    g = np.random.default_rng(seed)
    t = np.arange(T + 8) * dt
    freq = g.uniform(0.2, 1.5, size=(n, dims, 3))
    phase = g.uniform(0, 2 * np.pi, size=(n, dims, 3))
    amp = g.uniform(0.2, 0.5, size=(n, dims, 3))
    x = (amp[..., None] * np.sin(2 * np.pi * freq[..., None] * t + phase[..., None])).sum(2)
    x = x.transpose(0, 2, 1)  # [n, T + 8, dims]
    target = x[:, 8:]
    lagged = x[:, :-8]
    offset = g.normal(0, 0.15, size=(n, 1, dims))
    drift = np.cumsum(g.normal(0, 0.01, size=(n, T, dims)), axis=1)
    pred = 0.6 * lagged + offset + drift + g.normal(0, 0.15, size=(n, T, dims))
    return DecodingData(
        torch.tensor(target, dtype=torch.float32), torch.tensor(pred, dtype=torch.float32)
    )


def pearson_r(a: Tensor, b: Tensor) -> Tensor:
    """Per-axis Pearson correlation over all time steps of all trajectories: ``[dims]``."""
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    a, b = a - a.mean(0), b - b.mean(0)
    return (a * b).sum(0) / (a.norm(dim=0) * b.norm(dim=0)).clamp_min(1e-12)


def rmse(a: Tensor, b: Tensor) -> Tensor:
    """Per-axis root mean squared error: ``[dims]``."""
    return ((a - b) ** 2).reshape(-1, a.shape[-1]).mean(0).sqrt()


def window_states(pred: Tensor, window: int = 16) -> Tensor:
    """State at step t: the predictions ``p_{t-window+1..t}`` (left-padded with ``p_0``)
    relative to ``p_t``, and ``p_t`` itself: ``[N, T, (window + 1) * dims]``."""
    N, _, D = pred.shape
    padded = torch.cat([pred[:, :1].expand(N, window - 1, D), pred], 1)
    win = padded.unfold(1, window, 1).permute(0, 1, 3, 2)  # [N, T, window, D]
    rel = win - pred[:, :, None]
    return torch.cat([rel.flatten(2), pred], -1)


# ----------------------------------------------------------------------------- agent


@dataclass(frozen=True)
class ResidualRLConfig:
    window: int = 16
    max_delta: float = 1.0
    hidden: int = 128
    steps: int = 3000
    batch_size: int = 512
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    explore_std: float = 0.3
    actor_every: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            nonneg=("explore_std",),
            positive=("max_delta", "actor_lr", "critic_lr"),
            counts=("window", "hidden", "steps", "batch_size", "actor_every"),
        )


class ResidualAgent(nn.Module):
    """Actor ``delta = max_delta * tanh(mu(s))`` and twin critics ``Q(s, delta)``."""

    def __init__(self, state_dim: int, dims: int, cfg: ResidualRLConfig):
        super().__init__()
        self.cfg, self.dims = cfg, dims
        self.actor = mlp(state_dim, dims, cfg.hidden, nn.ReLU)
        self.q1 = mlp(state_dim + dims, 1, cfg.hidden, nn.ReLU)
        self.q2 = mlp(state_dim + dims, 1, cfg.hidden, nn.ReLU)
        self.register_buffer("s_mean", torch.zeros(state_dim))
        self.register_buffer("s_std", torch.ones(state_dim))

    def act(self, s: Tensor) -> Tensor:
        return self.cfg.max_delta * torch.tanh(self.actor((s - self.s_mean) / self.s_std))

    def q(self, s: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([(s - self.s_mean) / self.s_std, a / self.cfg.max_delta], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    @torch.no_grad()
    def correct(self, pred: Tensor) -> Tensor:
        """Corrected trajectories ``p + delta`` for ``pred [N, T, dims]``."""
        return pred + self.act(window_states(pred, self.cfg.window))

    def save(self, path_dir: str | Path) -> Path:
        """``model.safetensors`` (weights, normalisation) and ``config.json`` (written via a
        temporary file, then renamed)."""
        from safetensors.torch import save_file

        out = Path(path_dir)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"config": asdict(self.cfg), "state_dim": self.s_mean.numel(), "dims": self.dims}
        tmp = out / "model.safetensors.tmp"
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(tmp))
        tmp.replace(out / "model.safetensors")
        (out / "config.json.tmp").write_text(json.dumps(meta, indent=1))
        (out / "config.json.tmp").replace(out / "config.json")
        return out

    @classmethod
    def load(cls, path_dir: str | Path) -> ResidualAgent:
        from safetensors.torch import load_file

        folder = Path(path_dir)
        meta = json.loads((folder / "config.json").read_text())
        agent = cls(meta["state_dim"], meta["dims"], ResidualRLConfig(**meta["config"]))
        agent.load_state_dict(load_file(str(folder / "model.safetensors")))
        return agent.eval()


def train_residual_rl(
    data: DecodingData,
    cfg: ResidualRLConfig,
    log: Callable[[dict], None] | None = None,
    progress: bool = False,
) -> tuple[ResidualAgent, list[dict]]:
    """Offline actor-critic on the (state, target) pairs of ``data`` (gamma = 0); every
    500th step's row also goes to ``log``."""
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    S = window_states(data.pred, cfg.window).reshape(-1, (cfg.window + 1) * data.pred.shape[-1])
    P = data.pred.reshape(-1, data.pred.shape[-1])
    X = data.target.reshape(-1, data.target.shape[-1])
    agent = ResidualAgent(S.shape[1], P.shape[1], cfg)
    agent.s_mean.copy_(S.mean(0))
    agent.s_std.copy_(S.std(0).clamp_min(1e-6))
    q_opt = torch.optim.Adam([*agent.q1.parameters(), *agent.q2.parameters()], lr=cfg.critic_lr)
    a_opt = torch.optim.Adam(agent.actor.parameters(), lr=cfg.actor_lr)
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for step in tqdm(range(cfg.steps), disable=not progress, desc="residual RL"):
        idx = torch.randint(len(S), (cfg.batch_size,), generator=g)
        s, p, x = S[idx], P[idx], X[idx]
        with torch.no_grad():  # exploratory actions: around the actor and uniform in the box
            near = agent.act(s) + cfg.explore_std * torch.randn(p.shape, generator=g)
            wide = (torch.rand(p.shape, generator=g) * 2 - 1) * cfg.max_delta
            a = torch.where(torch.rand(len(s), 1, generator=g) < 0.5, near, wide)
            a = a.clamp(-cfg.max_delta, cfg.max_delta)
            r = -((p + a - x) ** 2).sum(-1)
        q1, q2 = agent.q(s, a)
        q_loss = F.mse_loss(q1, r) + F.mse_loss(q2, r)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        if step % cfg.actor_every == 0:
            a_loss = -torch.minimum(*agent.q(s, agent.act(s))).mean()
            a_opt.zero_grad()
            a_loss.backward()
            a_opt.step()
        if step % 500 == 0 or step == cfg.steps - 1:
            rows.append({"step": step, "q_loss": q_loss.item(), "reward": r.mean().item()})
            if log is not None:
                log(rows[-1])
    return agent, rows


def supervised_residual(data: DecodingData, cfg: ResidualRLConfig) -> nn.Module:
    """The obvious alternative: regress ``x_t - p_t`` from the same window (MSE)."""
    torch.manual_seed(cfg.seed)
    S = window_states(data.pred, cfg.window).reshape(-1, (cfg.window + 1) * data.pred.shape[-1])
    Y = (data.target - data.pred).reshape(-1, data.pred.shape[-1])
    agent = ResidualAgent(S.shape[1], Y.shape[1], cfg)
    agent.s_mean.copy_(S.mean(0))
    agent.s_std.copy_(S.std(0).clamp_min(1e-6))
    opt = torch.optim.Adam(agent.actor.parameters(), lr=cfg.actor_lr)
    g = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.steps // cfg.actor_every):
        idx = torch.randint(len(S), (cfg.batch_size,), generator=g)
        loss = F.mse_loss(agent.act(S[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return agent
