"""LWD's learner: DIVL values and QAM policy extraction for flow policies (catalog 001-23).

Learning While Deploying improves one shared flow policy from fleet data: demonstrations,
autonomous rollouts and human interventions, with a sparse reward (1 when an episode
ends in success, else 0). The abstract names the two parts; the equations below are our
reading of the paper's method section (as summarised in ``docs/algorithms/lwd.md``, with
what it leaves open and what we chose).

**DIVL: Distributional Implicit Value Learning.** Twin scalar critics ``Q1, Q2(s, a)`` over
action chunks and a categorical distribution ``p(v | s)`` over ``K`` atoms ``z_k`` evenly
spaced on ``[v_min, v_max]``: the spread of the (target) critic's values over the actions
the data holds at ``s``.

* value: ``L_V = -E[sum_k m_k log p(z_k | s)]`` with ``m`` the projection onto the two
  neighbouring atoms of ``min(Qbar1, Qbar2)(s, a)`` for replayed ``(s, a)``
  (:func:`categorical_projection`);
* bootstrap: the ``tau``-quantile of ``p(. | s')`` (:func:`distribution_quantile`),
  ``y = R + gamma^k Quant_tau(s')(V(s'))``, ``L_Q = sum_j (Q_j(s, a) - y)^2``;
* adaptive ``tau`` (:func:`adaptive_tau`): ``tau(s') = clip(tau_base - alpha H(s'), tau_min,
  tau_max)`` with ``H`` the normalised entropy of ``p(. | s')``: the more uncertain the value,
  the more pessimistic the bootstrap. ``tau_base`` is 0.6 offline and 0.9 online.

Fitting the distribution and then taking its ``tau``-quantile has the optimum of direct
quantile regression (the paper's Proposition 1; tested), so DIVL is IQL's in-sample
value learning with a state-dependent expectile replaced by a state-dependent quantile.

**QAM: Q-learning via Adjoint Matching.** The target policy is
``pi*(a | s) ~ pi_base(a | s) exp(inv_temp Q(s, a))``, with ``pi_base`` a flow kept
fitted by BC to the replay (its EMA; ``base: frozen``: the behaviour-cloned flow as it
was) and ``pi`` (initialised from the BC flow) the policy that acts. In the flow
convention of :mod:`rlpost.robot.policies.flow` (``sigma = 1`` noise, ``0`` data,
``v ~ eps - a``), on the grid ``sigma_i = 1 - i h``, ``h = 1 / N``:

* trajectories of the memoryless SDE of ``pi`` (no gradient), ``g_i^2 = 2 (sigma_i + h) /
  (1 - sigma_i + h)``::

      x_{i+1} = x_i - h [2 v(x_i, sigma_i) + x_i / (1 - sigma_i + h)] + sqrt(h) g_i xi_i

  with a plain Euler (ODE) last step, ``x_N = x_{N-1} - h v(x_{N-1}, sigma_{N-1})``;
* the lean adjoint, the exact adjoint of that recursion with the *base* drift:
  ``a_N = -inv_temp grad_a mean_j Qbar_j(s, clip(x_N))`` and
  ``a_i = a_{i+1} - h [2 J_i^T a_{i+1} + a_{i+1} / (1 - sigma_i + h)]`` (``J_i`` the base
  velocity's Jacobian at ``(x_i, sigma_i)``; the last step's has no SDE terms);
* the loss ``sum_i |2 (v - v_base)(x_i, sigma_i) / g_i - g_i a_i|^2``, whose minimiser is
  ``v = v_base + g_i^2 a_i / 2``: no back-propagation through the sampling chain.

On a 1-D Gaussian base with a linear critic the tilted policy is Gaussian with its mean
moved by ``inv_temp c s^2``; the tests check the adjoint against its closed form and
against autograd through the chain, and that the loss's optimum samples the tilted law.

:class:`LWDLearner` holds the critic, the value distribution, the target critic, the
policy and the base, and updates them from a batch of chunk transitions;
:func:`run_lwd` is the single-robot loop (``rlpost-robot train --config lwd_...``) and
:mod:`rlpost.robot.fleet` runs the same learner behind a fleet of robots on Ray.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlpost.robot.algos.base import RunContext
from rlpost.robot.algos.common import (
    Checkpoints,
    ChunkBuffer,
    LearnerState,
    chunk_transitions,
    collect_with,
    online_loop,
)
from rlpost.robot.algos.configuration_lwd import LWDConfig
from rlpost.robot.algos.otql import ChunkCritic
from rlpost.robot.policies.flow import FlowChunkPolicy

# ------------------------------------------------------------------------- config


# ------------------------------------------------------------------------- DIVL math


def categorical_projection(values: Tensor, support: Tensor) -> Tensor:
    """Project scalars ``values [B]`` onto the evenly spaced ``support [K]``: ``[B, K]``
    rows with two neighbouring non-zero entries (one on an atom) whose mean is the value
    clipped to the support's range."""
    k = support.numel()
    lo, hi = support[0], support[-1]
    dz = (hi - lo) / (k - 1)
    b = ((values.clamp(lo, hi) - lo) / dz).clamp(0, k - 1)
    low = b.floor().long()
    up = (low + 1).clamp(max=k - 1)
    w_up = b - low.to(b.dtype)
    out = torch.zeros(values.shape[0], k, dtype=values.dtype, device=values.device)
    out.scatter_add_(1, low[:, None], (1.0 - w_up)[:, None])
    out.scatter_add_(1, up[:, None], w_up[:, None])
    return out


def distribution_quantile(probs: Tensor, support: Tensor, tau: Tensor | float) -> Tensor:
    """The ``tau``-quantile of categorical distributions ``probs [B, K]`` on ``support``:
    the first atom whose cumulative probability reaches ``tau`` (``[B]``)."""
    cdf = probs.cumsum(1)
    tau = torch.as_tensor(tau, dtype=probs.dtype, device=probs.device).expand(probs.shape[0])
    # a rounding margin: a CDF that sums to tau in exact arithmetic counts as reaching it
    idx = (cdf < tau[:, None] - 1e-6).sum(1).clamp(max=support.numel() - 1)
    return support[idx]


def normalized_entropy(probs: Tensor) -> Tensor:
    """``-sum_k p_k log p_k / log K`` in ``[0, 1]`` (``[B]``)."""
    k = probs.shape[1]
    ent = -(probs * probs.clamp_min(1e-12).log()).sum(1)
    return ent / math.log(k)


def adaptive_tau(probs: Tensor, base: float, alpha: float, lo: float, hi: float) -> Tensor:
    """DIVL's bootstrap quantile ``clip(base - alpha H(p), lo, hi)`` per row (``[B]``,
    no gradient): the more spread the value distribution, the more pessimistic."""
    with torch.no_grad():
        return (base - alpha * normalized_entropy(probs)).clamp(lo, hi)


def divl_value_loss(logits: Tensor, targets: Tensor, support: Tensor) -> Tensor:
    """Cross-entropy of ``softmax(logits) [B, K]`` against the projected ``targets [B]``."""
    m = categorical_projection(targets.detach(), support)
    return -(m * F.log_softmax(logits, dim=1)).sum(1).mean()


class DIVLCritic(ChunkCritic):
    """OTQL's twin chunk critic (:class:`~rlpost.robot.algos.otql.ChunkCritic`) whose value
    head is the categorical distribution ``p(v | s)`` on ``atoms`` atoms of
    ``[v_min, v_max]`` (its logits)."""

    def __init__(
        self,
        obs_dim: int,
        chunk_dim: int,
        hidden: int = 256,
        atoms: int = 51,
        v_min: float = -0.1,
        v_max: float = 1.1,
    ):
        super().__init__(obs_dim, chunk_dim, hidden, v_out=atoms)
        self.register_buffer("support", torch.linspace(v_min, v_max, atoms))

    def value_logits(self, obs: Tensor) -> Tensor:
        return self.v(self._n(obs))

    def value_probs(self, obs: Tensor) -> Tensor:
        return torch.softmax(self.value_logits(obs), dim=1)


# -------------------------------------------------------------------------- QAM math


def memoryless_g2(sigma: Tensor | float, h: float) -> Tensor:
    """``g^2 = 2 (sigma + h) / (1 - sigma + h)``: the memoryless noise schedule, shifted by
    one grid step so that it is finite at ``sigma = 1``."""
    sigma = torch.as_tensor(sigma)
    return 2.0 * (sigma + h) / (1.0 - sigma + h)


VelocityFn = Callable[[Tensor, Tensor], Tensor]  # (x [B, ...], sigma scalar tensor) -> v


def memoryless_trajectory(
    velocity: VelocityFn, noise: Tensor, n_steps: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """``[x_0, ..., x_N]`` of the memoryless SDE of ``velocity`` from ``x_0 = noise``
    (``sigma = 1``) down to ``sigma = 0``, the last step a plain Euler step (no gradient)."""
    h = 1.0 / n_steps
    sig = torch.linspace(1.0, 0.0, n_steps + 1, dtype=noise.dtype, device=noise.device)
    xs = [noise]
    x = noise
    with torch.no_grad():
        for i in range(n_steps):
            v = velocity(x, sig[i])
            if i == n_steps - 1:
                x = x - h * v
            else:
                drift = 2.0 * v + x / (1.0 - sig[i] + h)
                xi = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
                x = x - h * drift + math.sqrt(h) * memoryless_g2(sig[i], h).sqrt() * xi
            xs.append(x)
    return xs


def lean_adjoint(
    velocity_base: VelocityFn, xs: Sequence[Tensor], grad_final: Tensor
) -> list[Tensor]:
    """The lean adjoints ``[a_0, ..., a_N]`` of :func:`memoryless_trajectory`'s recursion
    under the base drift, from ``a_N = grad_final`` (``-inv_temp grad_a Q``): each step is
    the transpose of that step's Jacobian applied to the next adjoint (a vector-Jacobian
    product through ``velocity_base``; no gradient flows out)."""
    n = len(xs) - 1
    h = 1.0 / n
    sig = torch.linspace(1.0, 0.0, n + 1, dtype=grad_final.dtype, device=grad_final.device)
    adj = [grad_final.detach()]
    a = grad_final.detach()
    for i in range(n - 1, -1, -1):
        x = xs[i].detach().requires_grad_(True)
        with torch.enable_grad():
            v = velocity_base(x, sig[i])
            (jta,) = torch.autograd.grad(v, x, grad_outputs=a)
        # the last step is Euler, x_N = x - h v; the others x - h (2 v + x / (1 - sigma + h))
        last = i == n - 1
        a = a - h * jta if last else a - h * (2.0 * jta + a / (1.0 - sig[i] + h))
        adj.append(a.detach())
    return adj[::-1]


def adjoint_matching_loss(
    velocity: VelocityFn, velocity_base: VelocityFn, xs: Sequence[Tensor], adj: Sequence[Tensor]
) -> Tensor:
    """``mean_batch sum_i |2 (v - v_base)(x_i, sigma_i) / g_i - g_i a_i|^2`` over the
    ``N`` steps (``xs``, ``adj`` from :func:`memoryless_trajectory` / :func:`lean_adjoint`);
    the gradient reaches ``velocity``'s parameters only."""
    n = len(xs) - 1
    h = 1.0 / n
    sig = torch.linspace(1.0, 0.0, n + 1, dtype=xs[0].dtype, device=xs[0].device)
    total = xs[0].new_zeros(())
    for i in range(n):
        g = memoryless_g2(sig[i], h).sqrt()
        x = xs[i].detach()
        with torch.no_grad():
            vb = velocity_base(x, sig[i])
        r = 2.0 * (velocity(x, sig[i]) - vb) / g - g * adj[i]
        total = total + r.pow(2).flatten(1).sum(1).mean()
    return total


# -------------------------------------------------------------------------- learner


def sparse_rewards(episodes: Sequence[Any]) -> list[Any]:
    """The episodes with LWD's sparse reward: 1 on the last step of a successful episode,
    0 elsewhere (a copy; the inputs are not changed)."""
    out = []
    for ep in episodes:
        e = copy.copy(ep)
        r = np.zeros(len(ep.actions), dtype=np.float32)
        if ep.success and len(r):
            r[-1] = 1.0
        e.rewards = r
        out.append(e)
    return out


class LWDLearner:
    """DIVL critic + value distribution, target critic, QAM policy and its base; one
    :meth:`update` per batch of chunk transitions (see the module docstring)."""

    def __init__(self, policy: FlowChunkPolicy, cfg: LWDConfig):
        self.cfg, self.policy = cfg, policy
        pc = policy.cfg
        self.base = copy.deepcopy(policy).eval().requires_grad_(False)
        self.base_fit: FlowChunkPolicy | None = None  # base "replay": BC on the replay
        if cfg.base == "replay":
            self.base_fit = copy.deepcopy(policy).train()
            self.base_opt = torch.optim.Adam(self.base_fit.parameters(), lr=cfg.base_lr)
        self.critic = DIVLCritic(
            pc.obs_dim, pc.horizon * pc.act_dim, cfg.hidden, cfg.atoms, cfg.v_min, cfg.v_max
        )
        self.critic.obs_mean.copy_(policy.obs_mean)
        self.critic.obs_std.copy_(policy.obs_std)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.q_opt = torch.optim.Adam(
            [*self.critic.q1.parameters(), *self.critic.q2.parameters()], lr=cfg.critic_lr
        )
        self.v_opt = torch.optim.Adam(self.critic.v.parameters(), lr=cfg.critic_lr)
        self.pi_opt = torch.optim.Adam(policy.parameters(), lr=cfg.policy_lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.online = False  # tau_base: offline until the first online batch

    # ------------------------------------------------------------------- critic
    def critic_step(self, b: dict[str, Tensor]) -> dict[str, float]:
        c, cr = self.cfg, self.critic
        with torch.no_grad():
            tq = torch.minimum(*self.target.q(b["obs"], b["chunks"]))
        v_loss = divl_value_loss(cr.value_logits(b["obs"]), tq, cr.support)
        self.v_opt.zero_grad()
        v_loss.backward()
        self.v_opt.step()
        with torch.no_grad():
            p_next = cr.value_probs(b["next_obs"])
            base = c.tau_online if self.online else c.tau_offline
            tau = adaptive_tau(p_next, base, c.tau_alpha, c.tau_min, c.tau_max)
            y = b["returns"] + b["discount"] * distribution_quantile(p_next, cr.support, tau)
        q1, q2 = cr.q(b["obs"], b["chunks"])
        q_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.q_opt.zero_grad()
        q_loss.backward()
        self.q_opt.step()
        with torch.no_grad():
            for p, tp in zip(cr.parameters(), self.target.parameters(), strict=True):
                tp.lerp_(p, c.target_tau)
        return {
            "v_loss": v_loss.item(),
            "q_loss": q_loss.item(),
            "q_mean": q1.mean().item(),
            "tau": tau.mean().item(),
        }

    # ------------------------------------------------------------------- policy
    def policy_step(self, obs: Tensor) -> dict[str, float]:
        c, pol, base = self.cfg, self.policy, self.base
        pc = pol.cfg
        noise = torch.randn(obs.shape[0], pc.horizon, pc.act_dim, generator=self.gen)
        cond = pol.condition(obs)
        cond_b = base.condition(obs)

        def vel(x: Tensor, s: Tensor) -> Tensor:
            return pol.velocity(obs, x, s, cond)

        def vel_base(x: Tensor, s: Tensor) -> Tensor:
            return base.velocity(obs, x, s, cond_b)

        xs = memoryless_trajectory(vel, noise, c.sample_steps, self.gen)
        a = xs[-1].detach().clamp(-1, 1).requires_grad_(True)
        with torch.enable_grad():
            q = torch.stack(self.target.q(obs, a)).mean(0).sum()
            (dq,) = torch.autograd.grad(q, a)
        adj = lean_adjoint(vel_base, xs, -c.inv_temp * dq)
        loss = adjoint_matching_loss(vel, vel_base, xs, adj)
        self.pi_opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(pol.parameters(), c.grad_clip)
        self.pi_opt.step()
        return {"pi_loss": loss.item(), "grad_q": dq.flatten(1).norm(dim=1).mean().item()}

    def base_step(self, b: dict[str, Tensor]) -> dict[str, float]:
        """``base: replay``: one BC (flow matching) step of the fitted base on the batch,
        then the base moves towards it by ``base_ema``."""
        fit = self.base_fit
        assert fit is not None
        loss = fit.flow_loss(b["obs"], b["chunks"], mask=b["mask"], generator=self.gen)
        self.base_opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(fit.parameters(), self.cfg.grad_clip)
        self.base_opt.step()
        with torch.no_grad():
            for p, tp in zip(fit.parameters(), self.base.parameters(), strict=True):
                tp.lerp_(p, self.cfg.base_ema)
        return {"base_loss": loss.item()}

    def update(self, b: dict[str, Tensor]) -> dict[str, float]:
        m = self.critic_step(b)
        if self.base_fit is not None:
            m.update(self.base_step(b))
        return {**m, **self.policy_step(b["obs"])}

    # ------------------------------------------------------------------- state
    def modules(self) -> dict[str, tuple[nn.Module, torch.optim.Optimizer | None]]:
        """Every module beside the policy, with its optimiser, for a checkpoint."""
        out: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {
            "critic": (self.critic, self.q_opt),
            "critic_v": (self.critic.v, self.v_opt),
            "target": (self.target, None),
            "base": (self.base, None),
        }
        if self.base_fit is not None:
            out["base_fit"] = (self.base_fit, self.base_opt)
        return out


_FIELDS = tuple(ChunkBuffer.__dataclass_fields__)


class ReplayMix:
    """The offline buffer (demonstrations) and the online one (rollouts, interventions);
    a batch draws ``online_fraction`` of its rows from the online buffer once it has any."""

    def __init__(self, offline: ChunkBuffer, online: ChunkBuffer | None = None):
        self.offline = offline
        self._rows: ChunkBuffer | None = None  # capacity grows by doubling: O(1) amortised add
        self._size = 0
        if online is not None:
            self.add(online)

    @property
    def online(self) -> ChunkBuffer | None:
        """The online transitions so far (views of the first rows of the storage)."""
        if self._rows is None:
            return None
        return ChunkBuffer(*(getattr(self._rows, k)[: self._size] for k in _FIELDS))

    def add(self, buf: ChunkBuffer) -> None:
        end = self._size + len(buf)
        if self._rows is None or end > len(self._rows):
            cap = max(end, 2 * (0 if self._rows is None else len(self._rows)), 1024)
            grown = []
            for k in _FIELDS:
                src = getattr(buf, k)
                t = src.new_empty((cap, *src.shape[1:]))
                if self._rows is not None:
                    t[: self._size] = getattr(self._rows, k)[: self._size]
                grown.append(t)
            self._rows = ChunkBuffer(*grown)
        for k in _FIELDS:
            getattr(self._rows, k)[self._size : end] = getattr(buf, k)
        self._size = end

    def sample(self, n: int, frac: float, gen: torch.Generator) -> dict[str, Tensor]:
        if self.online is None or len(self.online) == 0 or frac <= 0:
            return self.offline.sample(n, gen)
        k = min(n, max(1, round(n * frac)))
        on = self.online.sample(k, gen)
        if k == n:
            return on
        off = self.offline.sample(n - k, gen)
        return {key: torch.cat([off[key], on[key]]) for key in off}

    def state_tensors(self) -> dict[str, Tensor]:
        out = self.offline.state_tensors("offline")
        if self.online is not None:
            out.update(self.online.state_tensors("online"))
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> ReplayMix:
        online = None
        if any(k.startswith("online.") for k in tensors):
            online = ChunkBuffer.from_tensors(tensors, "online")
        return cls(ChunkBuffer.from_tensors(tensors, "offline"), online)


def transitions(episodes: Sequence[Any], horizon: int, gamma: float) -> ChunkBuffer:
    """Chunk transitions (chunks executed open loop) of ``episodes`` under the sparse reward."""
    return chunk_transitions(sparse_rewards(episodes), horizon, horizon, gamma)


def offline_phase(learner: LWDLearner, replay: ReplayMix, steps: int) -> dict[str, float]:
    """``steps`` updates on the offline buffer (critic, value and policy); mean metrics."""
    c = learner.cfg
    m: dict[str, float] = {}
    for _ in range(steps):
        b = replay.offline.sample(c.batch_size, learner.gen)
        for k, v in learner.update(b).items():
            m[k] = m.get(k, 0.0) + v / steps
    return m


# ------------------------------------------------------------------ single-robot loop


class LWDRounds:
    """LWD's learner with its replay (the demonstrations offline, rollouts and
    interventions online): one simulated robot's rounds of the shared online loop
    (``envs`` parallel copies of ``task``: collect with the current policy, add the online
    chunk transitions, ``updates_per_round`` updates), and the fleet's learner
    (:class:`~rlpost.robot.algos.common.ReplayLearner`: episodes added as the fleet
    records them, updates run by version)."""

    def __init__(
        self, policy: FlowChunkPolicy, demos: Sequence[Any], cfg: LWDConfig, task: str = ""
    ):
        self.learner, self.task = LWDLearner(policy, cfg), task
        self.replay = ReplayMix(transitions(demos, policy.cfg.horizon, cfg.gamma))

    @property
    def policy(self) -> FlowChunkPolicy:
        return self.learner.policy

    def warm_up(self) -> int:
        offline_phase(self.learner, self.replay, self.learner.cfg.offline_steps)
        return self.learner.cfg.offline_steps

    def add(self, episodes: Sequence[Any]) -> None:
        ln = self.learner
        self.replay.add(transitions(episodes, ln.policy.cfg.horizon, ln.cfg.gamma))
        ln.online = True

    def train(self, updates: int) -> dict[str, float]:
        ln, cfg = self.learner, self.learner.cfg
        m: dict[str, float] = {}
        for _ in range(updates):
            b = self.replay.sample(cfg.batch_size, cfg.online_fraction, ln.gen)
            for k, v in ln.update(b).items():
                m[k] = m.get(k, 0.0) + v / updates
        return m

    def online_size(self) -> int:
        online = self.replay.online
        return 0 if online is None else len(online)

    def collect(self, n: int, seed: int) -> list[Any]:
        return collect_with(self.learner.policy, self.task, n, seed, self.learner.cfg.sample_steps)

    def update(self, eps: list[Any]) -> dict[str, float]:
        self.add(eps)
        m = self.train(self.learner.cfg.updates_per_round)
        return {
            "online_success": float(np.mean([e.success for e in eps])),
            "buffer": self.online_size(),
            **m,
        }

    def export_state(self) -> LearnerState:
        ln = self.learner
        return LearnerState(
            model=ln.policy,
            optimizer=ln.pi_opt,
            extras=ln.modules(),
            generators={"learner": ln.gen},
            tensors=self.replay.state_tensors(),
            state={"online": ln.online},
        )

    def restore(self, state: dict[str, Any]) -> None:
        self.learner.online = bool(state.get("online", False))

    def import_state(self, state: dict[str, Any], tensors: dict[str, Tensor]) -> None:
        self.replay = ReplayMix.from_tensors(tensors)
        self.restore(state)


def run_lwd(
    policy: FlowChunkPolicy,
    task: str,
    demos: Sequence[Any],
    cfg: LWDConfig,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Fine-tune ``policy`` in place with LWD on one robot: ``offline_steps`` updates on
    the demonstrations (critic, value distribution and policy), then the shared online
    loop with rounds of ``envs`` episodes and ``updates_per_round`` updates on a 1:1 mix
    of demonstrations and online data. The fleet runtime (:mod:`rlpost.robot.fleet`) runs
    the same learner with many robots."""
    torch.manual_seed(cfg.seed)
    rounds = LWDRounds(policy, demos, cfg, task)
    if checkpoints is None or not checkpoints.resuming:
        rounds.warm_up()
    history = online_loop(
        rounds, cfg.episodes, cfg.envs, cfg.seed, log, progress,
        "lwd episodes", checkpoints,
    )  # fmt: skip
    return {"history": history, "config": asdict(cfg)}


__all__ = [
    "DIVLCritic",
    "LWDConfig",
    "LWDLearner",
    "LWDRounds",
    "ReplayMix",
    "adaptive_tau",
    "adjoint_matching_loss",
    "categorical_projection",
    "distribution_quantile",
    "divl_value_loss",
    "lean_adjoint",
    "memoryless_g2",
    "memoryless_trajectory",
    "normalized_entropy",
    "offline_phase",
    "run_lwd",
    "sparse_rewards",
    "transitions",
]


def run(ctx: RunContext) -> dict[str, Any]:
    """The registered runner: :func:`run_lwd` on the run's context."""
    return run_lwd(ctx.policy, ctx.task, ctx.demos, ctx.config, ctx.log, ctx.progress,
                   ctx.checkpoints)  # fmt: skip
