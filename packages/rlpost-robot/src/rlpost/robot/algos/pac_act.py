"""PAC-ACT (catalog 004-10): chunk-level actor-critic post-training of a pretrained ACT.

The abstract names three parts; each is one piece below.

1. **Chunk-level policy optimisation.** The decision is a whole action chunk
   ``a_{t:t+H}`` executed open loop: the MDP step is a chunk, its reward
   ``R = sum_{i<H} gamma^i r_{t+i}`` and the next state ``s_{t+H}``
   (:func:`~rlpost.robot.algos.common.chunk_transitions`). The actor is deterministic,
   ``mu_theta(s) = ACT(s)`` (zero CVAE latent), explored with Gaussian noise on the chunk;
   the critic is a TD3-style twin ``Q(s, a_{t:t+H})`` with a target actor and target
   smoothing noise. Actor objective (our reading; the abstract gives no formula):

       L_actor = -alpha * Q_1(s, mu_theta(s)) / mean|Q_1| + lambda * L_prior

2. **ACT-transferred actor-critic.** :class:`ActCritic`'s observation encoder is a copy of
   the pretrained ACT's transformer encoder with its state / environment-state
   projections and position embeddings (the latent token fixed at the zero-latent input
   ACT uses at inference); twin MLP heads read its three output tokens and the
   normalised chunk. The critic starts from features that already parse the task.

3. **Hybrid behaviour-prior constraint.** Two terms keep the policy near its pretrained
   action distribution:

       L_prior = m * E_{s ~ replay} ||(mu_theta(s) - mu_0(s)) / sigma_a||^2
               + (1 - m) * L_ACT(demonstrations)

   an anchor to the frozen pretrained actor ``mu_0`` on the states the policy visits (the
   KL between the equal-variance Gaussian exploration policies, up to a constant) and
   ACT's own behaviour-cloning loss on the demonstration set. ``lambda = 0`` is the
   unconstrained actor-critic baseline.

**Force safety.** :func:`force_safety_rewards` adds, per step,
``-c_exc * max(0, F - F_thr) / F_nom - c_viol * [F > F_thr]`` to the task reward, from the
per-step contact force the contact tasks record.
"""

from __future__ import annotations

import copy
import dataclasses
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
    force_stats,
    online_loop,
)
from rlpost.robot.algos.configuration_pac_act import PACACTConfig
from rlpost.robot.nets import mlp
from rlpost.robot.policies.act import ActChunkPolicy

STATE, ENV = "observation.state", "observation.environment_state"


# ------------------------------------------------------------------ force safety


def force_safety_rewards(
    rewards: np.ndarray,
    forces: np.ndarray,
    threshold: float,
    nominal: float,
    excess_coef: float,
    violation_coef: float,
) -> np.ndarray:
    """Task reward plus the force-safety terms (per step, forces in N)."""
    f = np.asarray(forces, dtype=np.float32)
    excess = np.maximum(0.0, f - threshold) / nominal
    return (
        np.asarray(rewards, np.float32) - excess_coef * excess - violation_coef * (f > threshold)
    ).astype(np.float32)


def shaped_episodes(episodes: Sequence[Any], task: str, cfg: PACACTConfig) -> list[Any]:
    """Copies of ``episodes`` whose rewards carry the force-safety terms (unchanged for
    tasks without force)."""
    from rlpost.robot.envs import CONTOUR, TASKS

    spec = TASKS[task]
    if not spec.has_force:
        return list(episodes)
    out = []
    for ep in episodes:
        if ep.contact_force is None:
            raise ValueError(f"a {task} episode has no per-step contact_force record")
        r = force_safety_rewards(
            ep.rewards,
            ep.contact_force,
            spec.force_threshold,
            CONTOUR.nominal_force,
            cfg.force_excess_coef,
            cfg.force_violation_coef,
        )
        out.append(dataclasses.replace(ep, rewards=r))
    return out


# -------------------------------------------------------------------------- critic


class ActCritic(nn.Module):
    """Twin chunk critic ``Q(s, a_{t:t+H})`` on a copy of the pretrained ACT's encoder.

    Inputs are lerobot-normalised observations (``ActChunkPolicy.normalized_obs``) and
    normalised chunks (``ActChunkPolicy.normalize_actions``).
    """

    def __init__(self, policy: ActChunkPolicy, hidden: int = 256):
        super().__init__()
        m = policy.act.model
        self.state_proj = copy.deepcopy(m.encoder_robot_state_input_proj)
        self.env_proj = copy.deepcopy(m.encoder_env_state_input_proj)
        # ACT feeds latent = 0 at inference: its latent token is the projection's bias
        self.latent_token = nn.Parameter(m.encoder_latent_input_proj.bias.detach().clone())
        self.pos = nn.Parameter(m.encoder_1d_feature_pos_embed.weight.detach().clone())
        self.encoder = copy.deepcopy(m.encoder)
        d, pc = self.latent_token.numel(), policy.cfg
        inp = 3 * d + pc.horizon * pc.act_dim
        self.q1, self.q2 = mlp(inp, 1, hidden), mlp(inp, 1, hidden)
        self.requires_grad_(True)
        self.eval()  # no dropout in the critic; gradients still flow

    def features(self, nobs: dict[str, Tensor]) -> Tensor:
        s = nobs[STATE]
        tokens = torch.stack(
            [self.latent_token.expand(s.shape[0], -1), self.state_proj(s), self.env_proj(nobs[ENV])]
        )  # [3, B, D]
        out = self.encoder(tokens, pos_embed=self.pos[:, None, :])
        return out.transpose(0, 1).flatten(1)

    def q(self, nobs: dict[str, Tensor], nchunk: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([self.features(nobs), nchunk.flatten(1)], dim=1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


# -------------------------------------------------------------------------- learner


class PACACT:
    """Critic and actor updates of PAC-ACT (see the module docstring)."""

    def __init__(self, policy: ActChunkPolicy, cfg: PACACTConfig):
        self.cfg, self.policy = cfg, policy
        self.prior = copy.deepcopy(policy).requires_grad_(False).eval()
        self.target_pi = copy.deepcopy(policy).requires_grad_(False).eval()
        self.critic = ActCritic(policy, cfg.hidden)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.q_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.pi_opt = torch.optim.Adam(policy.act.parameters(), lr=cfg.actor_lr)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.n_critic = 0

    def _q_in(self, chunk: Tensor) -> Tensor:
        return self.policy.normalize_actions(chunk.clamp(-1, 1))

    def critic_step(self, b: dict[str, Tensor]) -> dict[str, float]:
        c, pi = self.cfg, self.policy
        with torch.no_grad():
            na = self.target_pi.mean_chunk(b["next_obs"])
            eps = torch.randn(na.shape, generator=self.gen) * c.target_noise
            na = na + eps.clamp(-c.target_noise_clip, c.target_noise_clip)
            tq = torch.minimum(*self.target.q(pi.normalized_obs(b["next_obs"]), self._q_in(na)))
            y = b["returns"] + b["discount"] * tq
        q1, q2 = self.critic.q(pi.normalized_obs(b["obs"]), self._q_in(b["chunks"]))
        loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.q_opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.critic.parameters(), 10.0)
        self.q_opt.step()
        self.n_critic += 1
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.target.parameters(), strict=True):
                tp.lerp_(p, c.target_tau)
        return {"q_loss": loss.item(), "q_mean": q1.mean().item()}

    def prior_terms(self, obs: Tensor, demo: dict[str, Tensor] | None) -> dict[str, Tensor]:
        """The two parts of the hybrid behaviour-prior constraint (see the module docs)."""
        mu = self.policy.mean_chunk(obs)
        with torch.no_grad():
            mu0 = self.prior.mean_chunk(obs)
        anchor = ((mu - mu0) / self.policy.act_std).pow(2).mean()
        bc = torch.zeros(())
        if demo is not None:
            w = self.demo_weights(demo) if self.cfg.demo_weighting == "advantage" else None
            self.policy.act.train()
            bc, _ = self.policy.loss(demo["obs"], demo["chunks"], demo["mask"], weights=w)
            self.policy.act.eval()
        return {"mu": mu, "anchor": anchor, "bc": bc}

    @torch.no_grad()
    def demo_weights(self, demo: dict[str, Tensor]) -> Tensor:
        """``clip(exp(beta A / std A), 20)`` normalised to mean 1, with
        ``A = min Q(s, a_demo) - min Q(s, mu(s))`` from the target critic."""
        pi, obs = self.policy, demo["obs"]
        nobs = pi.normalized_obs(obs)
        q_demo = torch.minimum(*self.target.q(nobs, self._q_in(demo["chunks"])))
        q_pi = torch.minimum(*self.target.q(nobs, self._q_in(pi.mean_chunk(obs))))
        adv = q_demo - q_pi
        w = torch.exp(self.cfg.demo_beta * adv / adv.std().clamp_min(1e-6)).clamp(max=20.0)
        return w / w.mean()

    def actor_step(self, b: dict[str, Tensor], demo: dict[str, Tensor] | None) -> dict[str, float]:
        c, pi = self.cfg, self.policy
        use_prior = c.prior_coef > 0
        terms = self.prior_terms(b["obs"], demo if use_prior and c.prior_mix < 1 else None)
        q = self.critic.q(pi.normalized_obs(b["obs"]), self._q_in(terms["mu"]))[0]
        lam = c.q_coef / q.abs().mean().detach().clamp_min(1e-6)
        loss = -(lam * q).mean()
        if use_prior:
            prior = c.prior_mix * terms["anchor"] + (1 - c.prior_mix) * terms["bc"]
            loss = loss + c.prior_coef * prior
        self.pi_opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(pi.act.parameters(), 1.0)
        self.pi_opt.step()
        with torch.no_grad():
            for p, tp in zip(pi.act.parameters(), self.target_pi.act.parameters(), strict=True):
                tp.lerp_(p, c.target_tau)
        return {
            "actor_loss": loss.item(),
            "anchor": terms["anchor"].item(),
            "bc": float(terms["bc"].detach()),
        }


class _Explorer:
    """Chunk sampler for :class:`~rlpost.robot.policies.bc.ChunkController`: the actor's
    chunk plus Gaussian noise."""

    def __init__(self, policy: ActChunkPolicy, std: float, generator: torch.Generator):
        self.policy, self.std, self.gen = policy, std, generator
        self.cfg, self.device = policy.cfg, policy.device

    @torch.no_grad()
    def sample(self, obs: Tensor, **_: Any) -> Tensor:
        mu = self.policy.mean_chunk(obs)
        return (mu + self.std * torch.randn(mu.shape, generator=self.gen)).clamp(-1, 1)


# -------------------------------------------------------------------------- the loop


class _PACACTRounds:
    """PAC-ACT's round of the shared online loop: ``envs`` exploring episodes, their
    (force-shaped) chunk transitions, ``updates_per_round`` critic updates and every
    ``policy_delay``-th an actor update with a demonstration batch. Its state: the actor,
    the frozen prior, the target actor, the critic and its target, both optimisers, the
    generator (exploration, target noise, batches), the critic-step count and the replay
    buffer."""

    def __init__(self, learner: PACACT, buf: ChunkBuffer, task: str, demo_batch: Callable):
        self.learner, self.buf, self.task, self.demo_batch = learner, buf, task, demo_batch

    def collect(self, n: int, seed: int) -> list[Any]:
        from rlpost.robot.demos import collect_episodes
        from rlpost.robot.policies.bc import ChunkController

        policy, cfg = self.learner.policy, self.learner.cfg
        ctrl = ChunkController(
            _Explorer(policy, cfg.explore_std, self.learner.gen), execute=policy.cfg.horizon
        )
        return collect_episodes(self.task, ctrl, n_episodes=n, seed=seed, n_envs=n)

    def update(self, eps: list[Any]) -> dict[str, float]:
        learner, cfg = self.learner, self.learner.cfg
        H = learner.policy.cfg.horizon
        shaped = shaped_episodes(eps, self.task, cfg)
        self.buf = self.buf.extend(chunk_transitions(shaped, H, H, cfg.gamma))
        m: dict[str, float] = {}
        n_actor = 0
        for i in range(cfg.updates_per_round):
            b = self.buf.sample(cfg.batch_size, learner.gen)
            for k, v in learner.critic_step(b).items():
                m[k] = m.get(k, 0.0) + v / cfg.updates_per_round
            if i % cfg.policy_delay == 0:
                n_actor += 1
                for k, v in learner.actor_step(b, self.demo_batch()).items():
                    m[k] = m.get(k, 0.0) + v
        for k in ("actor_loss", "anchor", "bc"):
            m[k] = m.get(k, 0.0) / max(n_actor, 1)
        return {
            "online_success": float(np.mean([e.success for e in eps])),
            **force_stats(eps),
            "buffer": len(self.buf),
            **m,
        }

    def export_state(self) -> LearnerState:
        ln = self.learner
        return LearnerState(
            model=ln.policy,
            optimizer=ln.pi_opt,
            extras={
                "critic": (ln.critic, ln.q_opt),
                "target": (ln.target, None),
                "target_pi": (ln.target_pi, None),
                "prior": (ln.prior, None),
            },
            generators={"learner": ln.gen},
            tensors=self.buf.state_tensors("buffer"),
            state={"n_critic": ln.n_critic},
        )

    def import_state(self, state: dict[str, Any], tensors: dict[str, Tensor]) -> None:
        self.learner.n_critic = int(state["n_critic"])
        self.buf = ChunkBuffer.from_tensors(tensors, "buffer")


def run_pac_act(
    policy: ActChunkPolicy,
    task: str,
    demos: Sequence[Any],
    cfg: PACACTConfig,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Fine-tune ``policy`` in place on ``task`` with ``cfg.episodes`` online episodes.

    Critic warm-up on the (force-shaped) demonstrations, then the shared online loop
    (:func:`rlpost.robot.algos.common.online_loop`) with rounds of: collect ``cfg.envs``
    exploring episodes, add their chunk transitions, run ``updates_per_round`` critic
    updates and every ``policy_delay``-th an actor update. Returns the per-round history
    (online success, peak force, force exceedances). ``checkpoints``: the loop's
    checkpointing (:class:`~rlpost.robot.algos.common.Checkpoints`); when it resumes,
    the warm-up is skipped (the checkpoint holds its result).
    """
    from rlpost.robot.policies.bc import make_chunks

    torch.manual_seed(cfg.seed)
    H = policy.cfg.horizon
    learner = PACACT(policy, cfg)
    buf = chunk_transitions(shaped_episodes(demos, task, cfg), H, H, cfg.gamma)
    d_obs, d_chunks, d_mask = make_chunks(demos, H)

    def demo_batch() -> dict[str, Tensor]:
        idx = torch.randint(len(d_obs), (cfg.batch_size,), generator=learner.gen)
        return {"obs": d_obs[idx], "chunks": d_chunks[idx], "mask": d_mask[idx]}

    if checkpoints is None or not checkpoints.resuming:
        for _ in range(cfg.critic_pretrain_steps):
            learner.critic_step(buf.sample(cfg.batch_size, learner.gen))
    rounds = _PACACTRounds(learner, buf, task, demo_batch)
    history = online_loop(
        rounds, cfg.episodes, cfg.envs, cfg.seed, log, progress, "pac-act episodes", checkpoints
    )
    policy.eval()
    return {"history": history, "config": asdict(cfg)}


__all__ = [
    "PACACT",
    "ActCritic",
    "PACACTConfig",
    "force_safety_rewards",
    "run_pac_act",
    "shaped_episodes",
]


def run(ctx: RunContext) -> dict[str, Any]:
    """The registered runner: :func:`run_pac_act` on the run's context."""
    return run_pac_act(ctx.policy, ctx.task, ctx.demos, ctx.config, ctx.log, ctx.progress,
                       ctx.checkpoints)  # fmt: skip
