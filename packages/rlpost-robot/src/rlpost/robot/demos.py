"""Scripted demonstrators and episode collection for :mod:`rlpost.robot.envs`.

* :func:`make_expert` -- a scripted controller per task, ``"good"`` (succeeds most of the
  time) or ``"poor"`` (rarely succeeds: biased, noisy, slow, indecisive or aggressive);
  a stateful callable ``expert(obs) -> action in [-1, 1]`` with ``.reset()``;
* :func:`collect_episodes` -- roll out any policy into :class:`Episode` records;
* :func:`collect_demos` -- the deliberately suboptimal good + poor demonstration mix;
* LeRobotDataset I/O of these episodes: :mod:`rlpost.robot.lerobot_data`.

Per task, good vs poor:

* ``reacher``: inverse kinematics + joint PD (slight action noise); poor aims at a point
  1.5-6 cm off the target, with half the gain and ten times the noise.
* ``pusher``: resolved-rate control of the hand through the arm's Jacobian (from its own
  copy of the MJCF); it lowers the fork behind the puck and pushes it with the inner
  corner of the fork. Pusher-v5's puck is nearly massless, so contacts are very soft and
  pushing is slow: far pucks cannot be brought in within 100 steps, which caps the good
  expert at about 60-80 %. Poor aims at a goal 4-20 cm off, slower and with noise.
* ``multimodal_reach``: good picks one of the two goals at random per episode and goes
  straight to it (bimodal demonstrations); poor is indecisive (re-picks a goal at random
  every 4th step on average), slow and noisy.
* ``contour``: good descends at 0.1 m/s, regulates the contact force to the nominal 5 N
  from the force reading and slides at 0.12-0.18 m/s; poor slams the setpoint 3-6 cm into the
  surface, drags at 0.35-0.6 m/s and misses sideways by 1.8-5 cm (force spikes, rare
  success).

Typical use::

    demos = collect_demos("contour", n_good=20, n_poor=20, seed=0)
    root = write_lerobot_dataset(demos, tmp / "contour", task="contour")  # lerobot_data
"""

from __future__ import annotations

import abc
import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from rlpost.robot.envs import CONTOUR, TASKS, ContourEnv, make_env

__all__ = [
    "Episode",
    "Expert",
    "collect_demos",
    "collect_episodes",
    "make_expert",
    "success_rate",
]

_QUALITIES = ("good", "poor")


@dataclass
class Episode:
    """One rollout. ``obs [T+1, obs_dim]`` float32 (from the reset observation to the one
    after the last action), ``actions [T, act_dim]`` float32 (as executed: clipped to
    [-1, 1]), ``rewards [T]`` float32, ``success`` (at the final step) and ``metrics``
    (the env's ``episode_metrics``).

    Extras: ``terminated`` (ended by the task rather than the time limit),
    ``step_success [T]`` bool and, for contact tasks, ``contact_force [T]`` float32 (N)
    from the per-step infos; ``quality`` (``"good"`` / ``"poor"`` for demonstrations, else
    ``""``), ``task`` and the reset ``seed``; for a fleet's episodes, which steps a human
    drove, the policy version, the robot and the episode's id.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    success: bool
    metrics: dict[str, Any]
    terminated: bool = False
    step_success: np.ndarray | None = None
    contact_force: np.ndarray | None = None
    quality: str = ""
    task: str = ""
    seed: int | None = None
    intervention: np.ndarray | None = None
    """``[T]`` bool, fleet episodes: the steps a human drove (:mod:`rlpost.robot.fleet`)."""
    policy_version: int = -1
    """Fleet episodes: the version of the policy that acted (-1: none, e.g. scripted)."""
    robot: int = -1
    """Fleet episodes: the index of the robot that recorded it."""
    episode_id: int = -1
    """Fleet episodes: the id the fleet dispatched it under (unique in a run)."""

    def __len__(self) -> int:
        return len(self.actions)


def _derive(seed: int, *keys: int) -> int:
    """A 31-bit seed derived from ``seed`` and ``keys`` (independent streams)."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0] >> 1)


# ------------------------------------------------------------------ experts


class Expert(abc.ABC):
    """Base scripted controller: ``expert(obs) -> action in [-1, 1]``; ``reset()`` starts an
    episode (draws the episode's goal choice / bias / noise from the expert's own RNG)."""

    def __init__(self, quality: str, seed: int = 0) -> None:
        if quality not in _QUALITIES:
            raise ValueError(f"quality must be one of {_QUALITIES}, got {quality!r}")
        self.quality = quality
        self.good = quality == "good"
        self.rng = np.random.default_rng(seed)
        self.reset()

    @abc.abstractmethod
    def reset(self) -> None:
        """Start a new episode."""

    @abc.abstractmethod
    def __call__(self, obs: np.ndarray) -> np.ndarray: ...


class _ReacherExpert(Expert):
    """IK for the 2-link arm (links 0.1 / 0.11 m), then joint PD on the torque motors
    (gear 200, armature 1: about 200 rad/s^2 per unit action)."""

    L1, L2 = 0.1, 0.11

    def reset(self) -> None:
        rng = self.rng
        if self.good:
            self.bias, self.omega, self.noise = np.zeros(2), 12.0, 0.03
        else:
            ang = rng.uniform(0, 2 * math.pi)
            self.bias = rng.uniform(0.015, 0.06) * np.array([math.cos(ang), math.sin(ang)])
            self.omega, self.noise = 6.0, 0.3  # half the bandwidth, 10x the noise

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        q = np.arctan2(obs[2:4], obs[0:2])
        dq = obs[6:8]
        x, y = obs[4:6] + self.bias
        r2 = x * x + y * y
        c1 = np.clip((r2 - self.L1**2 - self.L2**2) / (2 * self.L1 * self.L2), -1.0, 1.0)
        best, best_err = None, np.inf
        for q1 in (math.acos(c1), -math.acos(c1)):
            q1 = float(np.clip(q1, -2.95, 2.95))
            q0 = math.atan2(y, x) - math.atan2(self.L2 * math.sin(q1), self.L1 + self.L2 * c1)
            err = np.array([q0, q1]) - q
            err[0] = (err[0] + math.pi) % (2 * math.pi) - math.pi  # joint 0 is unlimited
            if np.abs(err).sum() < best_err:
                best, best_err = err, np.abs(err).sum()
        w = self.omega
        a = (w * w * best - 2 * w * dq) / 200.0
        if self.noise:
            a = a + self.rng.normal(0, self.noise, 2)
        return np.clip(a, -1, 1).astype(np.float32)


class _PusherExpert(Expert):
    """Resolved-rate control of a point of the hand (damped least squares on the 6-D
    hand Jacobian of a private copy of Pusher-v5's MJCF), with a joint-centring null
    space term; torques ``= damping qd + 0.5 M_ii / dt (qd - dq)`` per joint.

    Phases: over the puck (10 cm up, behind it w.r.t. the goal), down to the table, push
    with the inner corner of the fork (fork yawed 45 deg to the push direction, so the
    crossbar and one prong both touch the puck), re-lift if the puck slips out.
    """

    _OFF = 0.099  # corner -> puck centre when both the crossbar and a prong touch it

    def __init__(self, quality: str, seed: int = 0) -> None:
        import gymnasium.envs.mujoco as gym_mujoco

        path = os.path.join(os.path.dirname(gym_mujoco.__file__), "assets", "pusher_v5.xml")
        self.model = mujoco.MjModel.from_xml_path(path)
        self.data = mujoco.MjData(self.model)
        self.hand = self.model.body("r_wrist_roll_link").id
        self.jacp = np.zeros((3, self.model.nv))
        self.jacr = np.zeros((3, self.model.nv))
        lo, hi = self.model.jnt_range[:7].T
        self.q_mid = 0.5 * (lo + hi)
        self.dt = 1.0 / TASKS["pusher"].fps
        self.kv = 0.5
        self.mass_matrix = np.zeros((self.model.nv, self.model.nv))
        super().__init__(quality, seed)

    def reset(self) -> None:
        self.phase, self.side, self.u = "pre", 0.0, np.array([0.0, 1.0])
        rng = self.rng
        if self.good:
            self.goal_bias, self.noise, self.vmax = np.zeros(2), 0.0, 0.8
        else:
            ang = rng.uniform(0, 2 * math.pi)
            self.goal_bias = rng.uniform(0.04, 0.2) * np.array([math.cos(ang), math.sin(ang)])
            self.noise, self.vmax = 0.3, 0.5

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        m, d = self.model, self.data
        q, dq, obj, goal = obs[:7], obs[7:14], obs[17:20], obs[20:23].copy()
        goal[:2] += self.goal_bias
        d.qpos[:7] = q
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        mujoco.mj_crb(m, d)
        mujoco.mj_fullM(m, d, self.mass_matrix)
        inertia = np.diag(self.mass_matrix)[:7]
        rot = d.xmat[self.hand].reshape(3, 3)
        if self.side == 0.0:  # near the base the other corner is reachable
            self.side = -1.0 if obj[0] < 0.31 else 1.0
        p = d.xpos[self.hand] + rot @ np.array([0.0, -0.1 * self.side, 0.0])
        mujoco.mj_jac(m, d, self.jacp, self.jacr, p, self.hand)
        wr = 0.1  # orientation weight
        jac = np.vstack([self.jacp[:, :7], wr * self.jacr[:, :7]])

        g = goal[:2] - obj[:2]
        dist = float(np.linalg.norm(g))
        if dist > 0.02:
            self.u = g / dist
        u = np.r_[self.u, 0.0]
        perp = np.r_[-self.u[1], self.u[0], 0.0]
        rel = obj - p
        behind = obj - u * (self._OFF + 0.005)
        if self.phase == "push" and not (
            abs(rel @ perp) < 0.05 and -0.02 < rel @ u < self._OFF + 0.06 and abs(rel[2]) < 0.05
        ):
            self.phase = "lift"
        if self.phase == "lift":
            target = np.r_[p[:2], obj[2] + 0.1]
            if abs(p[2] - target[2]) < 0.03:
                self.phase = "pre"
        if self.phase == "pre":
            target = behind + np.r_[0.0, 0.0, 0.1]
            if np.linalg.norm(target - p) < 0.03:
                self.phase = "descend"
        if self.phase == "descend":
            target = behind
            if np.linalg.norm(target - p) < 0.025:
                self.phase = "push"
        if self.phase == "push":
            target = obj - u * (self._OFF - min(0.08, dist))

        c, s = math.cos(-self.side * math.pi / 4), math.sin(-self.side * math.pi / 4)
        x_d = np.r_[c * self.u[0] - s * self.u[1], s * self.u[0] + c * self.u[1], 0.0]
        z_d = np.array([0.0, 0.0, 1.0])
        y_d = np.cross(z_d, x_d)
        e_rot = 0.5 * (
            np.cross(rot[:, 0], x_d) + np.cross(rot[:, 1], y_d) + np.cross(rot[:, 2], z_d)
        )
        v = 6.0 * (target - p)
        n = np.linalg.norm(v)
        if n > self.vmax:
            v *= self.vmax / n
        e = np.r_[v, wr * 6.0 * e_rot]
        qd = jac.T @ np.linalg.solve(jac @ jac.T + 0.05**2 * np.eye(6), e)
        null = np.eye(7) - np.linalg.pinv(jac) @ jac
        qd += null @ (0.5 * (self.q_mid - q))
        # damping feed-forward + velocity loop at half the gain that would be unstable
        tau = m.dof_damping[:7] * qd + self.kv * inertia / self.dt * (qd - dq)
        a = 0.5 * tau  # native torque bound is 2
        if self.noise:
            a = a + self.rng.normal(0, self.noise, 7)
        return np.clip(a, -1, 1).astype(np.float32)


class _MultimodalExpert(Expert):
    """Velocity command towards one goal: good picks a goal at random per episode; poor
    re-picks at random with probability 0.25 per step, is slower and noisy."""

    def reset(self) -> None:
        self.goal = int(self.rng.integers(2))
        if self.good:
            self.gain, self.vmax, self.noise, self.p_switch = 5.0, 1.0, 0.05, 0.0
        else:
            self.gain, self.vmax, self.noise, self.p_switch = 2.0, 0.35, 0.3, 0.25

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.p_switch and self.rng.random() < self.p_switch:
            self.goal = int(self.rng.integers(2))
        goal = obs[4 + 2 * self.goal : 6 + 2 * self.goal]
        v = self.gain * (goal - obs[:2])
        n = np.linalg.norm(v)
        if n > self.vmax:
            v *= self.vmax / n
        if self.noise:
            v = v + self.rng.normal(0, self.noise, 2)
        return np.clip(v, -1, 1).astype(np.float32)


class _ContourExpert(Expert):
    """Setpoint planner on the known cylinder: approach along the normal at A, then
    advance the setpoint's angle towards B (y interpolated) at a depth under the surface.

    Good: approach 0.1 m/s, slide 0.12-0.18 m/s, depth regulated so the measured force
    tracks 5 N, 1 mm setpoint noise. Poor (aggressive, sloppy): setpoint slammed 3-6 cm
    deep at once, slide 0.35-0.6 m/s, a 1.8-5 cm sideways miss and 5 mm setpoint noise.
    """

    def reset(self) -> None:
        rng = self.rng
        self.started = False
        if self.good:
            self.approach, self.speed = 0.1, rng.uniform(0.12, 0.18)
            self.depth = CONTOUR.nominal_force / CONTOUR.kp
            self.y_bias, self.noise = 0.0, 0.001
        else:
            self.approach, self.speed = None, rng.uniform(0.35, 0.6)
            self.depth = rng.uniform(0.03, 0.06)
            self.y_bias = rng.choice([-1.0, 1.0]) * rng.uniform(0.018, 0.05)
            self.noise = 0.005
        lo, hi = (np.array(x) for x in ([-0.3, -0.15, 0.05], [0.3, 0.15, 0.45]))
        self.lo, self.hi = lo, hi

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        c = CONTOUR
        p, force, b = obs[0:3], float(obs[6]), obs[7:10]
        if not self.started:  # the first observation: hovering above A
            self.started = True
            self.ang_a = math.atan2(p[0], p[2])
            self.y_a = float(p[1])
            self.ang_b = math.atan2(b[0], b[2])
            self.y_b = float(b[1])
            self.ang, self.radius = self.ang_a, float(math.hypot(p[0], p[2]))
            self.contact = False
        dt = 1.0 / TASKS["contour"].fps
        if not self.contact:
            self.contact = force >= c.contact_min_force
        if self.approach is None:  # poor: slam straight to depth
            self.radius = c.contact_radius - self.depth
            if self.contact or self.radius < c.contact_radius:
                self.contact = True
        elif not self.contact:
            self.radius = max(self.radius - self.approach * dt, c.contact_radius - 0.03)
        else:
            if self.good:
                self.depth = float(
                    np.clip(self.depth + 4e-4 * (c.nominal_force - force), 0.003, 0.03)
                )
            self.radius = c.contact_radius - self.depth
        if self.contact:
            step = self.speed * dt / c.contact_radius
            self.ang = min(self.ang + step, self.ang_b)
        frac = (self.ang - self.ang_a) / max(self.ang_b - self.ang_a, 1e-6)
        y = self.y_a + frac * (self.y_b - self.y_a) + self.y_bias
        sp = ContourEnv.arc_point(self.ang, y, self.radius)
        if self.noise:
            sp = sp + self.rng.normal(0, self.noise, 3)
        a = 2.0 * (sp - self.lo) / (self.hi - self.lo) - 1.0
        return np.clip(a, -1, 1).astype(np.float32)


_EXPERTS: dict[str, type[Expert]] = {
    "reacher": _ReacherExpert,
    "pusher": _PusherExpert,
    "multimodal_reach": _MultimodalExpert,
    "contour": _ContourExpert,
}


def make_expert(task: str, quality: str = "good", seed: int = 0) -> Expert:
    """Scripted controller for ``task`` (see the module docstring); ``seed`` drives its
    per-episode choices (goal, bias, noise)."""
    base = TASKS[task].base if task in TASKS and TASKS[task].base else task
    if base not in _EXPERTS:  # image variants use their base task's expert (state first)
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(_EXPERTS)}")
    return _EXPERTS[base](quality, seed)


# ------------------------------------------------------------------ collection


class _Recorder:
    def __init__(self, obs: np.ndarray, seed: int) -> None:
        self.obs, self.actions, self.rewards = [obs], [], []
        self.successes, self.forces, self.seed = [], [], seed

    def add(self, action, obs, reward, info) -> None:
        self.actions.append(np.clip(np.asarray(action, dtype=np.float32), -1, 1))
        self.obs.append(obs)
        self.rewards.append(reward)
        self.successes.append(bool(info["success"]))
        if "contact_force" in info:
            self.forces.append(float(info["contact_force"]))

    def finish(self, info: dict[str, Any], terminated: bool, task: str, quality: str) -> Episode:
        m = info["episode_metrics"]
        return Episode(
            obs=np.stack(self.obs).astype(np.float32),
            actions=np.stack(self.actions).astype(np.float32),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            success=bool(m["success"]),
            metrics=dict(m),
            terminated=bool(terminated),
            step_success=np.asarray(self.successes, dtype=bool),
            contact_force=np.asarray(self.forces, dtype=np.float32) if self.forces else None,
            quality=quality,
            task=task,
            seed=self.seed,
        )


def success_rate(episodes: list[Episode]) -> float | None:
    """The fraction of ``episodes`` that succeeded, over those whose success is known
    (a data set without ``next.success`` records none: ``None``, never 0)."""
    known = [e.success for e in episodes if e.metrics.get("success", e.success) is not None]
    return sum(known) / len(known) if known else None


def _reset_takes_ids(policy: Any) -> bool:
    try:
        return len(inspect.signature(policy.reset).parameters) > 0
    except (TypeError, ValueError):
        return False


def collect_episodes(
    task: str,
    policy_fn: Callable[[np.ndarray], np.ndarray],
    n_episodes: int = 10,
    seed: int = 0,
    *,
    n_envs: int = 1,
    quality: str = "",
    done: Callable[[], Any] | None = None,
) -> list[Episode]:
    """Roll out ``policy_fn`` for ``n_episodes`` episodes of ``task``; ``done`` is called
    as each episode ends (a progress bar's ``update``).

    Episode ``j`` is reset with a seed derived from ``(seed, j)``, so results do not
    depend on ``n_envs``. With ``n_envs == 1`` (default), ``policy_fn(obs [D]) -> [A]`` and
    its ``reset()`` (if any) is called before every episode. With ``n_envs > 1`` the
    episodes run in lock-step batches: ``policy_fn(obs [n_envs, D]) -> [n_envs, A]`` and
    ``policy_fn.reset(env_ids)`` (required) restarts the envs that begin a new episode
    (finished envs keep receiving their last observation; their actions are ignored).
    Returns the episodes in order of ``j``; ``quality`` labels them.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    done = done or (lambda: None)
    seeds = [_derive(seed, j) for j in range(n_episodes)]
    episodes: list[Episode | None] = [None] * n_episodes
    if n_envs <= 1:
        env = make_env(task, seed=None)
        for j, s in enumerate(seeds):
            obs, _ = env.reset(seed=s)
            if hasattr(policy_fn, "reset"):
                policy_fn.reset()
            rec = _Recorder(obs, s)
            while True:
                action = policy_fn(obs)
                obs, reward, terminated, truncated, info = env.step(action)
                rec.add(action, obs, reward, info)
                if terminated or truncated:
                    episodes[j] = rec.finish(info, terminated, task, quality)
                    done()
                    break
        env.close()
        return episodes  # type: ignore[return-value]

    if not hasattr(policy_fn, "reset") or not _reset_takes_ids(policy_fn):
        raise ValueError("n_envs > 1 needs a batched policy with reset(env_ids)")
    k = min(n_envs, n_episodes)
    envs = [make_env(task, seed=None) for _ in range(k)]
    slots: list[tuple[int, _Recorder] | None] = [None] * k
    last = [np.zeros(TASKS[task].obs_dim, np.float32)] * k
    next_j = 0

    def start(i: int) -> None:
        nonlocal next_j
        if next_j >= n_episodes:
            slots[i] = None
            return
        obs, _ = envs[i].reset(seed=seeds[next_j])
        slots[i], last[i] = (next_j, _Recorder(obs, seeds[next_j])), obs
        next_j += 1

    for i in range(k):
        start(i)
    policy_fn.reset(list(range(k)))  # type: ignore[attr-defined]
    while any(s is not None for s in slots):
        actions = np.asarray(policy_fn(np.stack(last)))
        restarted = []
        for i, slot in enumerate(slots):
            if slot is None:
                continue
            j, rec = slot
            obs, reward, terminated, truncated, info = envs[i].step(actions[i])
            rec.add(actions[i], obs, reward, info)
            last[i] = obs
            if terminated or truncated:
                episodes[j] = rec.finish(info, terminated, task, quality)
                done()
                start(i)
                if slots[i] is not None:
                    restarted.append(i)
        if restarted:
            policy_fn.reset(restarted)  # type: ignore[attr-defined]
    for env in envs:
        env.close()
    return episodes  # type: ignore[return-value]


def scripted_success(task: str, n: int, seed: int = 1000) -> dict[str, dict[str, float]]:
    """``{good, poor, random: {success[, peak_force, above_8n]}}``: the scripted good and
    poor demonstrators and uniform random actions over ``n`` episodes of ``task``; where
    the task logs contact force, the mean peak force (N) and the mean fraction of steps
    above 8 N."""
    rng = np.random.default_rng(0)
    act_dim = TASKS[task].act_dim
    runs = {
        q: collect_episodes(task, make_expert(task, q, seed=0), n, seed=seed) for q in _QUALITIES
    }
    runs["random"] = collect_episodes(task, lambda obs: rng.uniform(-1, 1, act_dim), n, seed=seed)
    out: dict[str, dict[str, float]] = {}
    for q, episodes in runs.items():
        out[q] = {"success": float(success_rate(episodes) or 0.0)}
        if q != "random" and episodes[0].contact_force is not None:
            out[q]["peak_force"] = float(np.mean([e.contact_force.max() for e in episodes]))
            out[q]["above_8n"] = float(np.mean([(e.contact_force > 8).mean() for e in episodes]))
    return out


def collect_demos(task: str, n_good: int = 20, n_poor: int = 20, seed: int = 0) -> list[Episode]:
    """A deliberately suboptimal demonstration mix: ``n_good`` episodes of the good
    expert, then ``n_poor`` of the poor one (``Episode.quality`` tells them apart)."""
    good = make_expert(task, "good", seed=_derive(seed, 1))
    poor = make_expert(task, "poor", seed=_derive(seed, 2))
    return [
        *collect_episodes(task, good, n_good, seed=_derive(seed, 3), quality="good"),
        *collect_episodes(task, poor, n_poor, seed=_derive(seed, 4), quality="poor"),
    ]
