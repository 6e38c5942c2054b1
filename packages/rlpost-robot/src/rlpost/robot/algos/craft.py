"""CRAFT: counterfactual proxy + grounded residual policy gradients (catalog 001-19).

Closed-loop RL fine-tuning has grounded but sparse feedback; counterfactual fine-tuning
(scoring candidate futures with an imperfect estimate) has dense but biased feedback.
CRAFT writes the real closed-loop policy gradient, under the same visited states, as

    grad J = E[grad log pi(a|s) A_real(s, a)]
           = E[grad log pi(a|s) A_proxy(s, a)]                      (dense proxy)
           + E[grad log pi(a|s) (A_real(s, a) - A_proxy(s, a))]     (grounded residual)

* **Proxy**: for each visited state, ``G`` candidate actions scored by the counterfactual
  estimate; their group-normalised scores are the proxy advantages of *all* candidates
  (:func:`counterfactual_advantages`) — many low-variance terms per state.
* **Residual**: for the executed action only, the grounded advantage from the real
  closed-loop outcome minus the proxy's advantage of that action
  (:func:`grounded_residual`); it removes the proxy's bias and has small variance when the
  proxy is aligned with reality. ``event_mask`` restricts it to interaction-critical
  events (where grounded feedback exists).
* **Stability**: the policy is pulled toward an EMA teacher by an asymmetric KL
  (:func:`asymmetric_kl`): ``KL(teacher || student)`` by default (mass-covering: the student
  keeps every action the teacher supports), optionally weighted more on one side.

The functions take log-probabilities so they serve discrete (vocabulary-scoring
planners) and continuous (Gaussian) policies alike.

:func:`run_craft` is the closed loop on our MuJoCo tasks: a
:class:`~rlpost.robot.policies.gaussian.GaussianChunkPolicy`, candidate chunks scored by a
cheap counterfactual future model of the task (:data:`PROXIES`; on ``multimodal_reach`` a
kinematic roll-forward that ignores the servo lag), grounded advantages from the real
episode returns.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlpost.robot.algos.base import RunContext
from rlpost.robot.algos.common import Checkpoints, LearnerState, online_loop
from rlpost.robot.algos.configuration_craft import CRAFTConfig


def counterfactual_advantages(scores: Tensor, eps: float = 1e-6) -> Tensor:
    """Group-normalised counterfactual advantages: ``scores [B, G]`` of ``G`` candidate
    actions per state -> ``(s - mean_G) / (std_G + eps)``. Equal scores give 0 (no NaN)."""
    mean = scores.mean(1, keepdim=True)
    std = scores.std(1, keepdim=True, unbiased=False)
    return (scores - mean) / (std + eps)


def grounded_residual(
    real_advantage: Tensor, proxy_of_executed: Tensor, event_mask: Tensor | None = None
) -> Tensor:
    """``A_real - A_proxy`` of the executed action ``[B]``; 0 outside ``event_mask``."""
    res = real_advantage - proxy_of_executed
    return res if event_mask is None else res * event_mask.to(res.dtype)


def craft_surrogate(
    cand_logp: Tensor,
    proxy_adv: Tensor,
    exec_logp: Tensor,
    residual: Tensor,
    residual_coef: float = 1.0,
) -> Tensor:
    """Loss whose gradient is ``-(proxy term + residual_coef * residual term)``.

    ``cand_logp [B, G]``: log-probs of the candidates (the proxy term is the expectation
    over candidates drawn from the policy, so it is averaged over ``G``);
    ``exec_logp [B]``: log-prob of the executed action. Advantages are detached.
    """
    proxy = (cand_logp * proxy_adv.detach()).mean(1)
    grounded = exec_logp * residual.detach()
    return -(proxy + residual_coef * grounded).mean()


def asymmetric_kl(
    student_logp: Tensor,
    teacher_logp: Tensor,
    forward_weight: float = 1.0,
    reverse_weight: float = 0.0,
) -> Tensor:
    """``forward_weight KL(teacher || student) + reverse_weight KL(student || teacher)`` over
    the last (action) dimension of full log-probability tables ``[..., A]``; mean over the
    rest. The teacher is detached."""
    t = teacher_logp.detach()
    fwd = (t.exp() * (t - student_logp)).sum(-1)
    rev = (student_logp.exp() * (student_logp - t)).sum(-1)
    return (forward_weight * fwd + reverse_weight * rev).mean()


class EMATeacher:
    """``theta_teacher <- decay theta_teacher + (1 - decay) theta_student`` after each step."""

    def __init__(self, student: nn.Module, decay: float = 0.99):
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(student).requires_grad_(False).eval()

    @torch.no_grad()
    def update(self, student: nn.Module) -> None:
        for t, s in zip(self.model.parameters(), student.parameters(), strict=True):
            t.lerp_(s, 1 - self.decay)


# ------------------------------------------------------------------ closed-loop fine-tuning


def gaussian_asymmetric_kl(
    s_mean: Tensor,
    s_log_std: Tensor,
    t_mean: Tensor,
    t_log_std: Tensor,
    forward_weight: float = 1.0,
    reverse_weight: float = 0.0,
) -> Tensor:
    """:func:`asymmetric_kl` for diagonal Gaussians (closed form), summed over the last
    dimension, mean over the rest. The teacher is detached."""
    t_mean, t_log_std = t_mean.detach(), t_log_std.detach()

    def kl(m1: Tensor, ls1: Tensor, m2: Tensor, ls2: Tensor) -> Tensor:  # KL(N1 || N2)
        return (
            ls2 - ls1 + (torch.exp(2 * ls1) + (m1 - m2) ** 2) / (2 * torch.exp(2 * ls2)) - 0.5
        ).sum(-1)

    fwd = kl(t_mean, t_log_std, s_mean, s_log_std)
    rev = kl(s_mean, s_log_std, t_mean, t_log_std)
    return (forward_weight * fwd + reverse_weight * rev).mean()


# --------------------------------------------------------- counterfactual future models


def kinematic_proxy_multimodal_reach(
    obs: np.ndarray, cands: np.ndarray, goal_rotation: float = 0.0
) -> np.ndarray:
    """Counterfactual score of candidate chunks on ``multimodal_reach``: roll the point mass
    forward as if it tracked the commanded velocity at once (``p_k = p_0 + dt sum a``; the
    real servo lags by 0.1 s, so the estimate is biased) and score
    ``sum_k -dist(p_k, nearest goal) + 1[some p_k within 0.05 m]``.
    ``goal_rotation`` (rad) rotates the goals about the effector in the model: a
    miscalibrated world model. ``obs [B, 8]``, ``cands [B, G, H, 2]`` -> ``[B, G]``."""
    from rlpost.robot.envs import MULTIMODAL, TASKS

    dt = 1.0 / TASKS["multimodal_reach"].fps
    p0 = obs[:, :2]
    goals = obs[:, 4:8].reshape(-1, 2, 2)
    if goal_rotation:
        c, s = np.cos(goal_rotation), np.sin(goal_rotation)
        rel = goals - p0[:, None]
        goals = p0[:, None] + rel @ np.array([[c, s], [-s, c]])
    p = p0[:, None, None] + dt * np.cumsum(np.clip(cands, -1, 1), axis=2)  # [B, G, H, 2]
    d = np.linalg.norm(p[..., None, :] - goals[:, None, None], axis=-1).min(-1)  # [B, G, H]
    return -d.sum(-1) + (d < MULTIMODAL.success_radius).any(-1)


#: task -> {name: counterfactual model ``(obs [B, D], cands [B, G, H, A]) -> scores [B, G]``}
PROXIES: dict[str, dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "multimodal_reach": {
        "kinematic": kinematic_proxy_multimodal_reach,
        "miscalibrated": lambda o, c: kinematic_proxy_multimodal_reach(o, c, goal_rotation=0.6),
    },
}


# ------------------------------------------------------------------ the closed loop


def _collect(policy: Any, task: str, n: int, seed: int, cfg: CRAFTConfig, gen: torch.Generator):
    """``n`` closed-loop episodes in lock-step; at every chunk decision, ``G`` candidates
    (the first executed) and their counterfactual scores. Returns the decisions as
    tensors and the episodes' final infos."""
    from rlpost.robot.demos import _derive
    from rlpost.robot.envs import make_env

    proxy = PROXIES[task][cfg.proxy] if cfg.mode != "real" else None
    H = policy.cfg.horizon
    envs = [make_env(task, seed=None) for _ in range(n)]
    obs = np.stack([e.reset(seed=_derive(seed, i))[0] for i, e in enumerate(envs)])
    done = np.zeros(n, bool)
    rewards: list[list[float]] = [[] for _ in range(n)]
    dec: dict[str, list] = {"env": [], "t": [], "obs": [], "cands": [], "scores": []}
    terminal = np.zeros(n, bool)
    finals: list[dict[str, Any]] = [{} for _ in range(n)]
    while not done.all():
        act = np.flatnonzero(~done)
        o = torch.as_tensor(obs[act], dtype=torch.float32)
        cands = policy.explore(o, cfg.group, generator=gen)  # [B, G, H, A]
        c_np = cands.numpy()
        scores = proxy(obs[act], c_np) if proxy is not None else np.zeros(c_np.shape[:2])
        for b, i in enumerate(act):
            dec["env"].append(i)
            dec["t"].append(len(rewards[i]))
            for k in range(H):
                ob, r, term, trunc, info = envs[i].step(np.clip(c_np[b, 0, k], -1, 1))
                rewards[i].append(float(r))
                obs[i] = ob
                if term or trunc:
                    done[i], finals[i], terminal[i] = True, info["episode_metrics"], term
                    break
        dec["obs"].append(o)
        dec["cands"].append(cands)
        dec["scores"].append(torch.as_tensor(scores, dtype=torch.float32))
    for e in envs:
        e.close()
    # per decision j of env i at step t: the executed chunk's discounted reward R_j, the
    # discount to the next decision (0 after a terminal step) and the return-to-go
    env, t0 = np.asarray(dec["env"]), np.asarray(dec["t"])
    m = len(env)
    chunk_r, disc, rtg = (np.zeros(m, np.float32) for _ in range(3))
    nxt = np.full(m, -1)
    for i in range(n):
        js = np.flatnonzero(env == i)  # this env's decisions, in time order
        r = np.asarray(rewards[i], np.float32)
        g = 0.0
        ends = [*t0[js][1:], len(r)]
        for pos in range(len(js) - 1, -1, -1):
            j, a, b = js[pos], t0[js[pos]], ends[pos]
            w = cfg.gamma ** np.arange(b - a)
            chunk_r[j] = float((w * r[a:b]).sum())
            last = pos == len(js) - 1
            disc[j] = 0.0 if last and terminal[i] else cfg.gamma ** (b - a)
            g = chunk_r[j] + cfg.gamma ** (b - a) * g
            rtg[j] = g
            nxt[j] = -1 if last else js[pos + 1]
    batch = {
        "obs": torch.cat(dec["obs"]),
        "cands": torch.cat(dec["cands"]),
        "scores": torch.cat(dec["scores"]),
        "returns": torch.as_tensor(rtg),
        "chunk_reward": torch.as_tensor(chunk_r),
        "discount": torch.as_tensor(disc),
        "next": torch.as_tensor(nxt),
        "final_obs": torch.as_tensor(obs[env], dtype=torch.float32),
    }
    return batch, finals


def chunk_gae(b: dict[str, Tensor], v: Tensor, v_final: Tensor, lam: float) -> Tensor:
    """Chunk-level GAE of the executed chunks: ``delta_j = R_j + discount_j V(s_{j+1}) -
    V(s_j)`` (``V(final obs)`` after an episode's last decision, discount 0 if terminal),
    ``A_j = delta_j + discount_j lam A_{j+1}`` along each episode."""
    nxt = b["next"]
    v_next = torch.where(nxt >= 0, v[nxt.clamp_min(0)], v_final)
    delta = b["chunk_reward"] + b["discount"] * v_next - v
    adv = torch.zeros_like(delta)
    for j in range(len(delta) - 1, -1, -1):  # successors have larger indices
        k = int(nxt[j])
        adv[j] = delta[j] + (b["discount"][j] * lam * adv[k] if k >= 0 else 0.0)
    return adv


class _CRAFTRounds:
    """CRAFT's round of the shared online loop (see :func:`run_craft`). Its state: the
    policy, the EMA teacher, the value baseline, both optimisers and the generator of the
    candidates (on-policy: no buffer outlives a round)."""

    def __init__(self, policy: Any, task: str, cfg: CRAFTConfig):
        from rlpost.robot.nets import mlp

        self.policy, self.task, self.cfg = policy, task, cfg
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.teacher = EMATeacher(policy, cfg.ema_decay)
        self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
        self.value = mlp(policy.cfg.obs_dim, 1, 128)
        self.v_opt = torch.optim.Adam(self.value.parameters(), lr=1e-3)

    def collect(self, n: int, seed: int):
        self.policy.eval()
        return _collect(self.policy, self.task, n, seed, self.cfg, self.gen)

    def update(self, data) -> dict[str, float]:
        b, finals = data
        policy, cfg, value, teacher = self.policy, self.cfg, self.value, self.teacher
        x = (b["obs"] - policy.obs_mean) / policy.obs_std
        for _ in range(cfg.value_steps):  # the baseline of the real advantage
            v_loss = (value(x).squeeze(-1) - b["returns"]).pow(2).mean()
            self.v_opt.zero_grad()
            v_loss.backward()
            self.v_opt.step()
        with torch.no_grad():
            v = value(x).squeeze(-1)
            v_final = value((b["final_obs"] - policy.obs_mean) / policy.obs_std).squeeze(-1)
            a_real = chunk_gae(b, v, v_final, cfg.gae_lambda)
            a_real = a_real / a_real.std().clamp_min(1e-6)
            proxy = counterfactual_advantages(b["scores"])
            corr = torch.corrcoef(torch.stack([proxy[:, 0], a_real]))[0, 1]
            if cfg.mode == "real":
                proxy = torch.zeros_like(proxy)
            scale = cfg.proxy_scale
            if scale == "fit":  # least-squares scale of the proxy on the grounded advantages
                p0 = proxy[:, 0]
                scale = float((a_real @ p0).clamp_min(0) / (p0 @ p0).clamp_min(1e-6))
            proxy = scale * proxy
            residual = grounded_residual(a_real, proxy[:, 0])
            coef = 0.0 if cfg.mode == "proxy" else cfg.residual_coef
        policy.train()
        for _ in range(cfg.updates_per_round):
            mu = policy.mean(b["obs"])
            cand_logp = policy.log_prob(b["obs"], b["cands"], mean=mu)
            loss = craft_surrogate(cand_logp, proxy, cand_logp[:, 0], residual, coef)
            t_mu = teacher.model.mean(b["obs"])
            kl = gaussian_asymmetric_kl(
                mu.flatten(1),
                policy.log_std.flatten().expand_as(mu.flatten(1)),
                t_mu.flatten(1),
                teacher.model.log_std.flatten().expand_as(t_mu.flatten(1)),
                cfg.kl_forward,
                cfg.kl_reverse,
            )
            total = loss + cfg.kl_coef * kl
            self.opt.zero_grad(set_to_none=True)
            total.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            self.opt.step()
            with torch.no_grad():
                policy.log_std.clamp_(min=cfg.min_log_std)
            teacher.update(policy)
        return {
            "online_success": float(np.mean([f["success"] for f in finals])),
            "online_return": float(np.mean([f["return"] for f in finals])),
            "decisions": len(b["returns"]),
            "proxy_real_corr": float(corr) if cfg.mode != "real" else 0.0,
            "proxy_scale": float(scale),
            "surrogate": float(loss.detach()),
            "kl": float(kl.detach()),
            "std": float(policy.log_std.detach().exp().mean()),
        }

    def export_state(self) -> LearnerState:
        return LearnerState(
            model=self.policy,
            optimizer=self.opt,
            extras={"value": (self.value, self.v_opt), "teacher": (self.teacher.model, None)},
            generators={"learner": self.gen},
        )

    def import_state(self, state: dict[str, Any], tensors: dict[str, Tensor]) -> None:
        del state, tensors  # everything is in the modules, optimisers and generator


def run_craft(
    policy: Any,
    task: str,
    cfg: CRAFTConfig,
    log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    checkpoints: Checkpoints | None = None,
) -> dict[str, Any]:
    """Closed-loop CRAFT fine-tuning of a :class:`GaussianChunkPolicy` in place.

    The shared online loop (:func:`rlpost.robot.algos.common.online_loop`); each round:
    ``cfg.envs`` episodes; at every chunk decision ``G`` candidates from the policy, the
    first executed, all scored by the task's counterfactual model (:data:`PROXIES`).
    Proxy advantages: group-normalised scores. Real advantage of the executed chunk: its
    discounted return-to-go minus a value baseline fitted on the round (chunk-level GAE,
    :func:`chunk_gae`), divided by the batch std; the proxy is scaled onto it
    (``proxy_scale``). Then ``updates_per_round`` steps on :func:`craft_surrogate` +
    ``kl_coef`` * the Gaussian asymmetric KL to the EMA teacher. ``checkpoints``: the
    loop's checkpointing (:class:`~rlpost.robot.algos.common.Checkpoints`).
    """
    _check_proxy(task, cfg)
    torch.manual_seed(cfg.seed)
    rounds = _CRAFTRounds(policy, task, cfg)
    history = online_loop(
        rounds, cfg.episodes, cfg.envs, cfg.seed, log, progress, f"craft[{cfg.mode}] episodes",
        checkpoints,
    )  # fmt: skip
    policy.eval()
    return {"history": history, "config": asdict(cfg)}


def _check_proxy(task: str, cfg: CRAFTConfig) -> None:
    """At config load and at run: the proxy mode needs a counterfactual model of the task."""
    if cfg.mode != "real" and cfg.proxy not in PROXIES.get(task, {}):
        have = sorted(PROXIES.get(task, {}))
        raise ValueError(
            f"proxy={cfg.proxy!r} is not a counterfactual model of task {task!r} (have "
            f"{have}); use mode=real, another task, or register one in "
            "rlpost.robot.algos.craft.PROXIES"
        )


def run(ctx: RunContext) -> dict[str, Any]:
    """The registered runner: :func:`run_craft` on the run's context. CRAFT fine-tunes from
    its own closed-loop rollouts; the demonstrations only built the BC policy."""
    return run_craft(ctx.policy, ctx.task, ctx.config, ctx.log, ctx.progress,
                     ctx.checkpoints)  # fmt: skip
