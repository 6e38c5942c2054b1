"""Robot tasks for RL post-training: four MuJoCo tasks behind one gymnasium interface.

:func:`make_env` returns a :class:`TaskEnv` (a ``gymnasium.Wrapper``) with the same
conventions for every task in :data:`TASKS`:

* observations are float32 ``[obs_dim]``; actions are normalised to ``[-1, 1]^act_dim``
  (clipped, then rescaled linearly to the native actuator bounds);
* every ``info`` (reset and step) has ``"success"`` (bool: the task is solved in the
  current state) and ``"distance"`` (float: the task's error measure, in metres); contact
  tasks also ``"contact_force"`` (float, Newtons: peak over the control step's physics
  substeps of the magnitude of the net contact force on the end effector);
* the step that ends an episode (terminated or truncated) adds ``info["episode_metrics"]``:
  ``return``, ``length``, ``success`` (at the final step), ``ever_success``, ``peak_force``
  and ``frac_force_above`` (fraction of steps above ``TaskSpec.force_threshold``; both
  ``None`` for tasks without force);
* episodes truncate at ``TaskSpec.max_steps``; ``multimodal_reach`` and ``contour``
  terminate on success, the gymnasium tasks never terminate (success is judged at the end);
* determinism: ``reset(seed=s)`` followed by identical actions gives an identical
  trajectory; the first ``reset()`` without a seed uses ``make_env``'s ``seed``.

Tasks:

* ``reacher`` -- gymnasium ``Reacher-v5`` (2-link planar arm, torques). Success (our
  threshold): fingertip-target distance < 0.02 m (the two spheres touch).
* ``pusher`` -- gymnasium ``Pusher-v5`` (7-DoF arm pushes a puck). Success: horizontal
  object-goal distance < 0.08 m (the puck's centre is on the goal disc).
* ``multimodal_reach`` -- our scene ``robots/multimodal_reach.xml``: a planar point mass
  with velocity servos starts between two goals placed on opposite sides of it (random
  orientation); reaching *either* (distance < 0.05 m) succeeds. Good demonstrations are
  bimodal, so a unimodal (MSE) policy that averages them stays near the start and fails.
* ``contour`` -- our scene ``robots/contour.xml``: a spherical end effector on position
  servos must press on a rigid cylinder and slide over its arc from A to B. Success: four
  checkpoints on the arc visited in order without losing contact, then within 0.02 m of B
  while in contact (force >= 0.5 N). Nominal pressing force 5 N; ``force_threshold`` = 8 N (60 %
  above nominal, the analogue of PAC-ACT's 60 N on a real arm). Careful contact stays
  near 5-6 N; slamming into the surface or dragging fast and deep gives 20-40 N spikes,
  random setpoints over 100 N.

Typical use::

    env = make_env("contour", seed=0)
    obs, info = env.reset()
    obs, r, terminated, truncated, info = env.step(np.zeros(env.action_space.shape))
    vec = make_vec_env("reacher", n=8, seed=0)      # SyncVectorEnv, NEXT_STEP autoreset
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from rlpost.robot.tasks import (
    CONTOUR,
    MULTIMODAL,
    PIXELS,
    TASKS,
    TaskSpec,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CONTOUR",
    "MULTIMODAL",
    "TASKS",
    "ContourEnv",
    "MultimodalReachEnv",
    "TaskEnv",
    "TaskSpec",
    "make_env",
    "make_vec_env",
    "render_frames",
    "scene_path",
]


# ------------------------------------------------------------------ our MJCF scenes


def scene_path(name: str) -> str:
    """Filesystem path of the packaged MJCF scene ``robots/<name>.xml``."""
    return str(resources.files("rlpost.robot") / "robots" / f"{name}.xml")


class _MjcfEnv(gym.Env):
    """Base for our scenes: loads the packaged XML, steps ``frame_skip`` physics steps per
    control step, renders with ``mujoco.Renderer`` from the scene's ``overview`` camera."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 25}  # noqa: RUF012
    scene = ""
    frame_skip = 1

    def __init__(self, render_mode: str | None = None, render_size: int = 128) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.model = mujoco.MjModel.from_xml_path(scene_path(self.scene))
        self.data = mujoco.MjData(self.model)
        self.dt = self.model.opt.timestep * self.frame_skip
        self.metadata = {**self.metadata, "render_fps": round(1.0 / self.dt)}
        self.render_mode, self.render_size = render_mode, render_size
        self._renderer: mujoco.Renderer | None = None
        lo, hi = self.model.actuator_ctrlrange.T
        self.action_space = gym.spaces.Box(lo.astype(np.float32), hi.astype(np.float32))

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.render_size, self.render_size)
        self._renderer.update_scene(self.data, camera="overview")
        return self._renderer.render().copy()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class MultimodalReachEnv(_MjcfEnv):
    """Native ``multimodal_reach``: a 1 kg point mass on two slide joints with velocity
    servos (action: target velocity in m/s, ``[-1, 1]^2``; time constant 0.1 s).

    Reset: start ``s ~ U(-0.05, 0.05)^2``; goal 0 at ``s + 0.4 (cos t, sin t)`` with
    ``t ~ U(-pi/4, pi/4)``, goal 1 at ``s - 0.4 (cos t, sin t)`` (opposite side).
    Observation (8): ``x, y, vx, vy, goal0_x, goal0_y, goal1_x, goal1_y``.
    Reward: ``-distance + 1 on success``, where ``distance`` is to the nearest goal.
    Terminates when ``distance < 0.05`` (success).
    """

    scene = "multimodal_reach"
    frame_skip = MULTIMODAL.frame_skip

    def __init__(self, render_mode: str | None = None, render_size: int = 128) -> None:
        super().__init__(render_mode, render_size)
        self.const = MULTIMODAL  # a task variant replaces fields (goal_radius, goal_angle)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float64)
        self._goal_sites = [self.model.site(f"goal{i}").id for i in range(2)]
        self.goals = np.zeros((2, 2))

    def _obs(self) -> np.ndarray:
        d = self.data
        return np.concatenate([d.qpos, d.qvel, self.goals.ravel()])

    def _measure(self) -> dict[str, Any]:
        dist = float(np.min(np.linalg.norm(self.goals - self.data.qpos, axis=1)))
        return {"success": dist < self.const.success_radius, "distance": dist}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        c, rng = self.const, self.np_random
        mujoco.mj_resetData(self.model, self.data)
        start = rng.uniform(-c.start_noise, c.start_noise, 2)
        theta = rng.uniform(-c.goal_angle, c.goal_angle)
        offset = c.goal_radius * np.array([math.cos(theta), math.sin(theta)])
        self.goals = np.stack([start + offset, start - offset])
        for sid, g in zip(self._goal_sites, self.goals, strict=True):
            self.model.site_pos[sid, :2] = g
        self.data.qpos[:] = start
        mujoco.mj_forward(self.model, self.data)
        return self._obs(), self._measure()

    def step(self, action):
        self.data.ctrl[:] = action
        mujoco.mj_step(self.model, self.data, self.frame_skip)
        info = self._measure()
        reward = -info["distance"] + (1.0 if info["success"] else 0.0)
        return self._obs(), reward, bool(info["success"]), False, info


class ContourEnv(_MjcfEnv):
    """Native ``contour``: a 0.5 kg sphere (radius 0.015 m) on x/y/z slide joints with
    position servos (kp 400 N/m, kv 40 N s/m, |force| <= 40 N, gravity compensated) must
    press on the top of a rigid cylinder (radius 0.25 m, axis along y) and slide over its
    arc from A to B.

    Action: servo setpoint in metres, x in [-0.3, 0.3], y in [-0.15, 0.15], z in
    [0.05, 0.45]. A setpoint ``d`` metres inside the surface presses with about
    ``400 d`` N at rest, so the nominal 5 N needs ``d`` = 1.25 cm.
    Reset: A and B on the arc at angles ``U(-0.65, -0.5)`` and ``U(0.5, 0.65)`` rad from the
    vertical, y ``~ U(-0.06, 0.06)`` each; the effector starts at rest 5 cm above A. Four
    checkpoints lie evenly on the arc between them (angle and y interpolated); they are
    visited in order: the next one counts when the effector passes within 0.03 m of it
    while in contact, and a control step without contact resets the count to zero.
    Observation (11): effector position (3), velocity (3), contact force (1, N), B (3),
    fraction of checkpoints visited (1, ``info["progress"]``). ``distance``: effector
    centre to B (the centre's position when touching the surface at B).
    ``contact_force``: peak over the 10 physics substeps of ``|sum of mj_contactForce|``
    over the effector's contacts (N); ``in_contact``: that force >= 0.5 N.
    Reward: ``-distance - 0.1 max(0, force - 8 N) / 5 N - 0.3 [no contact]
    + 0.25 [per newly visited checkpoint] + 1 [success]``.
    Success (terminates): every checkpoint visited and within 0.02 m of B while in contact
    (force >= 0.5 N) -- the contour was followed in contact, not jumped over.
    """

    scene = "contour"
    frame_skip = CONTOUR.frame_skip

    def __init__(self, render_mode: str | None = None, render_size: int = 128) -> None:
        super().__init__(render_mode, render_size)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (11,), np.float64)
        self._eff = self.model.geom("effector").id
        self._site_a, self._site_b = self.model.site("A").id, self.model.site("B").id
        self._f6 = np.zeros(6)
        self.point_a, self.point_b = np.zeros(3), np.zeros(3)
        self.checkpoints = np.zeros((CONTOUR.n_checkpoints, 3))
        self.n_visited = 0
        self.force = 0.0

    @staticmethod
    def arc_point(angle: float, y: float, radius: float = CONTOUR.contact_radius) -> np.ndarray:
        """Point at ``radius`` from the cylinder axis, ``angle`` rad from the vertical."""
        return np.array([radius * math.sin(angle), y, radius * math.cos(angle)])

    def contact_force(self) -> float:
        """Magnitude (N) of the net contact force on the effector in the current state."""
        m, d, f6 = self.model, self.data, self._f6
        if d.ncon == 0:
            return 0.0
        if d.ncon == 1:  # the usual case: one sphere-cylinder contact
            mujoco.mj_contactForce(m, d, 0, f6)
            return math.sqrt(f6[0] * f6[0] + f6[1] * f6[1] + f6[2] * f6[2])
        total = np.zeros(3)
        for i in range(d.ncon):
            con = d.contact[i]
            if self._eff not in (con.geom1, con.geom2):
                continue
            mujoco.mj_contactForce(m, d, i, f6)
            f = f6[:3] @ con.frame.reshape(3, 3)  # contact frame -> world
            total += f if con.geom2 == self._eff else -f
        return float(np.linalg.norm(total))

    def _obs(self) -> np.ndarray:
        d = self.data
        progress = self.n_visited / CONTOUR.n_checkpoints
        return np.concatenate([d.qpos, d.qvel, [self.force], self.point_b, [progress]])

    def _measure(self) -> dict[str, Any]:
        """Step info; also advances the checkpoint counter (call once per state)."""
        c, pos = CONTOUR, self.data.qpos
        dist = float(np.linalg.norm(pos - self.point_b))
        in_contact = self.force >= c.contact_min_force
        if not in_contact:  # contact lost for a whole control step: start over
            self.n_visited = 0
        while (
            in_contact
            and self.n_visited < c.n_checkpoints
            and np.linalg.norm(self.checkpoints[self.n_visited] - pos) < c.checkpoint_radius
        ):
            self.n_visited += 1
        done = self.n_visited == c.n_checkpoints
        return {
            "success": bool(dist < c.success_radius and in_contact and done),
            "distance": dist,
            "contact_force": self.force,
            "in_contact": bool(in_contact),
            "progress": self.n_visited / c.n_checkpoints,
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        c, rng = CONTOUR, self.np_random
        mujoco.mj_resetData(self.model, self.data)
        ang_a, ang_b = rng.uniform(*c.arc_a), rng.uniform(*c.arc_b)
        y_a, y_b = rng.uniform(-c.y_range, c.y_range, 2)
        self.point_a = self.arc_point(ang_a, y_a)
        self.point_b = self.arc_point(ang_b, y_b)
        self.model.site_pos[self._site_a] = self.point_a
        self.model.site_pos[self._site_b] = self.point_b
        frac = np.arange(1, c.n_checkpoints + 1) / (c.n_checkpoints + 1)
        self.checkpoints = np.stack(
            [self.arc_point(ang_a + f * (ang_b - ang_a), y_a + f * (y_b - y_a)) for f in frac]
        )
        self.n_visited = 0
        start = self.arc_point(ang_a, y_a, c.contact_radius + c.hover)
        self.data.qpos[:] = start
        self.data.ctrl[:] = start
        mujoco.mj_forward(self.model, self.data)
        self.force = self.contact_force()
        return self._obs(), self._measure()

    def step(self, action):
        m, d = self.model, self.data
        d.ctrl[:] = action
        peak = 0.0
        for _ in range(self.frame_skip):
            mujoco.mj_step(m, d)
            if d.ncon:
                peak = max(peak, self.contact_force())
        self.force = peak
        n_visited = self.n_visited
        info = self._measure()
        c = CONTOUR
        reward = (
            -info["distance"]
            - 0.1 * max(0.0, peak - c.force_threshold) / c.nominal_force
            - (0.0 if info["in_contact"] else c.no_contact_penalty)
            + c.checkpoint_bonus * (self.n_visited - n_visited)
            + (c.success_bonus if info["success"] else 0.0)
        )
        return self._obs(), reward, info["success"], False, info


# ------------------------------------------------------------------ gymnasium tasks


def _reacher_measure(u: Any) -> float:
    return float(np.linalg.norm(u.get_body_com("fingertip") - u.get_body_com("target")))


def _pusher_measure(u: Any) -> float:
    return float(np.linalg.norm(u.get_body_com("object")[:2] - u.get_body_com("goal")[:2]))


class _Measured(gym.Wrapper):
    """Adds ``success`` / ``distance`` to a gymnasium MuJoCo env's infos."""

    def __init__(self, env: gym.Env, measure: Callable[[Any], float], thr: float):
        super().__init__(env)
        self._measure, self._thr = measure, thr

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        dist = self._measure(self.env.unwrapped)
        return {**info, "success": dist < self._thr, "distance": dist}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._info(info)

    def step(self, action):
        obs, r, terminated, truncated, info = self.env.step(action)
        return obs, float(r), terminated, truncated, self._info(info)


# ------------------------------------------------------------------ camera variants


class _PixelObs(gym.Wrapper):
    """Appends the flattened ``rgb_array`` render (uint8 values as floats) to the state."""

    def __init__(self, env: gym.Env, spec: TaskSpec) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (spec.obs_dim,), np.float64)

    def _with_pixels(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([obs, np.asarray(self.env.render(), np.float64).ravel()])

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._with_pixels(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_pixels(obs), reward, terminated, truncated, info


def _make_native(task: str, render_mode: str | None, render_size: int) -> gym.Env:
    spec = TASKS[task]
    if spec.base is not None:  # image variant: the base task rendered at PIXELS x PIXELS
        if render_mode is not None:
            raise ValueError(f"{task} renders its own camera; use {spec.base} to render frames")
        return _PixelObs(_make_native(spec.base, "rgb_array", PIXELS), spec)
    if task in ("reacher", "pusher"):
        kwargs: dict[str, Any] = {"max_episode_steps": spec.max_steps, "render_mode": render_mode}
        if render_mode == "rgb_array":
            kwargs.update(width=render_size, height=render_size)
        gym_id = {"reacher": "Reacher-v5", "pusher": "Pusher-v5"}[task]
        measure = _reacher_measure if task == "reacher" else _pusher_measure
        return _Measured(gym.make(gym_id, **kwargs), measure, spec.success_threshold)
    cls = MultimodalReachEnv if task == "multimodal_reach" else ContourEnv
    return cls(render_mode=render_mode, render_size=render_size)


class TaskEnv(gym.Wrapper):
    """The common task interface (see the module docstring) over a native env.

    ``task_spec`` is the task's :class:`TaskSpec`; ``native_low`` / ``native_high`` are
    the native action bounds that ``-1`` / ``+1`` map to (see :meth:`scale_action`).
    """

    def __init__(self, env: gym.Env, spec: TaskSpec, seed: int | None = None) -> None:
        super().__init__(env)
        self.task_spec = spec
        native = env.action_space
        self.native_low = np.asarray(native.low, dtype=np.float64)
        self.native_high = np.asarray(native.high, dtype=np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (spec.act_dim,), np.float32, seed=seed)
        self.observation_space = gym.spaces.Box(
            -np.inf, np.inf, (spec.obs_dim,), np.float32, seed=seed
        )
        self._first_seed = seed
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._ret, self._len, self._ever = 0.0, 0, False
        self._peak, self._n_above = 0.0, 0

    def scale_action(self, action: np.ndarray) -> np.ndarray:
        """Normalised ``[-1, 1]`` action (clipped) -> native action (float64)."""
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(self.task_spec.act_dim), -1, 1)
        return self.native_low + 0.5 * (a + 1.0) * (self.native_high - self.native_low)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        self._first_seed = None
        obs, info = self.env.reset(seed=seed, options=options)
        self._reset_stats()
        return np.asarray(obs, dtype=np.float32), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(self.scale_action(action))
        spec = self.task_spec
        reward = float(reward)
        self._ret += reward
        self._len += 1
        self._ever = self._ever or bool(info["success"])
        if spec.has_force:
            f = float(info["contact_force"])
            self._peak = max(self._peak, f)
            self._n_above += int(f > spec.force_threshold)
        terminated = bool(terminated)
        truncated = bool(truncated) or (not terminated and self._len >= spec.max_steps)
        if terminated or truncated:
            info["episode_metrics"] = {
                "return": self._ret,
                "length": self._len,
                "success": bool(info["success"]),
                "ever_success": self._ever,
                "peak_force": self._peak if spec.has_force else None,
                "frac_force_above": self._n_above / self._len if spec.has_force else None,
            }
        return np.asarray(obs, dtype=np.float32), reward, terminated, truncated, info


def make_env(
    task: str, seed: int | None = 0, render_mode: str | None = None, *, render_size: int = 128
) -> TaskEnv:
    """A :class:`TaskEnv` for ``task`` (a key of :data:`TASKS`).

    ``seed`` seeds the first ``reset()`` (when called without a seed) and the spaces.
    ``render_mode``: ``None`` or ``"rgb_array"`` (``render_size`` square frames).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    return TaskEnv(_make_native(task, render_mode, render_size), TASKS[task], seed=seed)


def make_vec_env(
    task: str,
    n: int = 8,
    seed: int = 0,
    autoreset_mode: gym.vector.AutoresetMode = gym.vector.AutoresetMode.NEXT_STEP,
) -> gym.vector.SyncVectorEnv:
    """``n`` in-process copies of :func:`make_env` (env ``i`` seeded ``seed + i``).

    gymnasium's default ``NEXT_STEP`` autoreset: the step after an episode ends returns
    the new episode's first observation (reward 0; ignore that transition). Episode
    metrics arrive as ``info["episode_metrics"]`` with ``info["_episode_metrics"]`` masks.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    fns = [lambda i=i: make_env(task, seed=seed + i) for i in range(n)]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=autoreset_mode)


_render_failure: str | None = None  # why rendering failed in this process (then never retried)


def _camera(task: str, obs: np.ndarray) -> np.ndarray:
    """The camera image carried at the end of an image task's observation."""
    shape = TASKS[task].image_shape
    return np.asarray(obs[-int(np.prod(shape)) :]).reshape(shape)


def render_frames(
    task: str,
    policy_fn: Callable[[np.ndarray], np.ndarray],
    seed: int,
    steps: int,
    size: int = 128,
) -> list[np.ndarray] | None:
    """RGB frames ``[size, size, 3]`` uint8 of one episode of ``policy_fn`` on ``task``:
    the reset state, then one frame per step (at most ``steps``; stops at episode end).
    On an image task the frames are the camera images of its observations (their size).

    Returns ``None`` (and logs why) when no OpenGL backend works -- after the first
    failure, without trying again. On headless Linux this module selects ``MUJOCO_GL=egl``
    when it is unset, libEGL exists and mujoco was not yet imported.
    """
    global _render_failure
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    backend = os.environ.get("MUJOCO_GL", "").lower()
    if _render_failure is None and sys.platform.startswith("linux") and backend in ("", "glfw"):
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            _render_failure = "glfw needs a display and there is none"
    env = None
    camera = TASKS[task].image_shape is not None  # image task: frames are the policy's view
    if _render_failure is None:
        try:
            if camera:
                env = make_env(task, seed=seed)
            else:
                env = make_env(task, seed=seed, render_mode="rgb_array", render_size=size)
            obs, _ = env.reset(seed=seed)
            first = _camera(task, obs) if camera else env.render()
        except Exception as exc:  # any GL failure: missing libraries, bad MUJOCO_GL
            _render_failure = f"{type(exc).__name__}: {exc}"
    if _render_failure is not None:
        # MuJoCo may abort the process on a second failed GL context: never retry.
        logger.warning(
            "render_frames: no working OpenGL backend for MuJoCo (MUJOCO_GL=%r): %s. "
            "Headless Linux needs libEGL (MUJOCO_GL=egl) or libOSMesa (MUJOCO_GL=osmesa), "
            "set before mujoco is first imported.",
            os.environ.get("MUJOCO_GL"),
            _render_failure,
        )
        return None
    assert env is not None
    frames = [np.asarray(first, dtype=np.uint8)]
    if hasattr(policy_fn, "reset"):
        policy_fn.reset()
    try:
        for _ in range(steps):
            obs, _, terminated, truncated, _ = env.step(policy_fn(obs))
            frame = _camera(task, obs) if camera else env.render()
            frames.append(np.asarray(frame, dtype=np.uint8))
            if terminated or truncated:
                break
    finally:
        env.close()
    return frames
