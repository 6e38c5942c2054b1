"""LeRobotDataset I/O for :mod:`rlpost.robot.demos`' episodes (the ``lerobot`` extra):
:func:`write_lerobot_dataset` / :func:`add_lerobot_episode` write :class:`Episode` records
(with the fleet's columns when asked), :func:`load_lerobot_dataset` reads any robot's data
set back onto a task by feature name, exact for observations and actions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlpost.robot.demos import Episode
from rlpost.robot.envs import TASKS

_QUALITY_CODES = {"": 0, "good": 1, "poor": 2}


def _lerobot_dataset_cls() -> Any:
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as exc:
        from rlpost.core import MissingDependency

        raise MissingDependency(
            "LeRobotDataset I/O needs lerobot: pip install 'rlpost-robot[lerobot]' "
            "(the app: 'rlpost-app-robot[lerobot]')"
        ) from exc
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()  # one "Map" bar per saved episode otherwise
    return LeRobotDataset


def obs_split(task: str) -> tuple[np.ndarray, np.ndarray]:
    """``(robot state indices, environment-state indices)`` of ``task``'s observation
    (``observation.state`` / ``observation.environment_state`` of its data sets)."""
    spec = TASKS[task]
    env_idx = np.asarray(spec.env_obs, dtype=np.int64)
    state_idx = np.setdiff1d(np.arange(spec.obs_dim), env_idx)
    return state_idx, env_idx


#: per-frame columns of a fleet's episodes (:mod:`rlpost.robot.fleet`), int64 ``(1,)``
#: each but ``intervention`` (bool): who drove, which policy, which robot, which episode
FLEET_COLUMNS = ("intervention", "policy_version", "robot_index", "episode_id")


def lerobot_features(
    task: str, rename: dict[str, str] | None = None, fleet: bool = False
) -> dict[str, dict[str, Any]]:
    """The LeRobotDataset features :func:`write_lerobot_dataset` writes for ``task`` (the
    robot's names through ``rename``), with the fleet's :data:`FLEET_COLUMNS` when
    ``fleet``."""
    spec = TASKS[task]
    state_idx, env_idx = obs_split(task)
    rename = rename or {}
    obs_names = [rename.get(n, n) for n in spec.obs_names]  # an image task's: front.<i>
    vec = {"dtype": "float32", "names": None}
    flag = {"dtype": "bool", "shape": (1,), "names": None}
    features: dict[str, dict[str, Any]] = {
        "observation.state": {
            "dtype": "float32",
            "shape": (len(state_idx),),
            "names": [obs_names[i] for i in state_idx],
        },
        "observation.environment_state": {
            "dtype": "float32",
            "shape": (len(env_idx),),
            "names": [obs_names[i] for i in env_idx],
        },
        "action": {
            "dtype": "float32",
            "shape": (spec.act_dim,),
            "names": [rename.get(n, n) for n in spec.act_names],
        },
        "next.reward": {**vec, "shape": (1,)},
        "next.done": flag,
        "next.terminated": flag,
        "next.success": flag,
        "next.observation": {**vec, "shape": (spec.obs_dim,)},
        "quality": {"dtype": "int64", "shape": (1,), "names": None},
    }
    if spec.has_force:
        features["next.contact_force"] = {**vec, "shape": (1,)}
    if fleet:
        features["intervention"] = flag
        for name in FLEET_COLUMNS[1:]:
            features[name] = {"dtype": "int64", "shape": (1,), "names": None}
    return features


def add_lerobot_episode(ds: Any, ep: Episode, task: str, fleet: bool = False) -> None:
    """Append ``ep`` to an open, writable LeRobotDataset (frames, then ``save_episode``),
    in the layout of :func:`lerobot_features`."""
    spec = TASKS[task]
    state_idx, env_idx = obs_split(task)
    language = spec.description or task
    obs = np.asarray(ep.obs, dtype=np.float32)
    t_len = len(ep.actions)
    succ = ep.step_success if ep.step_success is not None else np.zeros(t_len, bool)
    if ep.step_success is None:
        succ[-1] = ep.success
    quality = np.array([_QUALITY_CODES.get(ep.quality, 0)], dtype=np.int64)
    human = ep.intervention if ep.intervention is not None else np.zeros(t_len, bool)
    ids = {
        "policy_version": np.array([ep.policy_version], dtype=np.int64),
        "robot_index": np.array([ep.robot], dtype=np.int64),
        "episode_id": np.array([ep.episode_id], dtype=np.int64),
    }
    for t in range(t_len):
        frame = {
            "observation.state": obs[t, state_idx],
            "observation.environment_state": obs[t, env_idx],
            "action": np.asarray(ep.actions[t], dtype=np.float32),
            "next.reward": np.array([ep.rewards[t]], dtype=np.float32),
            "next.done": np.array([t == t_len - 1]),
            "next.terminated": np.array([ep.terminated and t == t_len - 1]),
            "next.success": np.array([bool(succ[t])]),
            "next.observation": obs[t + 1],
            "quality": quality,
            "task": language,
        }
        if spec.has_force:
            f = 0.0 if ep.contact_force is None else float(ep.contact_force[t])
            frame["next.contact_force"] = np.array([f], dtype=np.float32)
        if fleet:
            frame["intervention"] = np.array([bool(human[t])])
            frame.update(ids)
        ds.add_frame(frame)
    ds.save_episode()


def write_lerobot_dataset(
    demos: Sequence[Episode],
    root: str | os.PathLike,
    task: str,
    fps: float | None = None,
    robot_type: str | None = None,
    rename: dict[str, str] | None = None,
) -> Path:
    """Write ``demos`` as a local LeRobotDataset at ``root`` (which must not exist yet).

    Per frame ``t``: ``observation.state`` (robot part of ``obs[t]``),
    ``observation.environment_state`` (the ``TaskSpec.env_obs`` part: targets, objects,
    goals -- what ACT needs without cameras), ``action``, ``next.reward``, ``next.done``
    (last frame), ``next.terminated``, ``next.success``, ``next.observation`` (full
    ``obs[t+1]``), ``next.contact_force`` (contact tasks) and ``quality`` (0 unlabelled,
    1 good, 2 poor). Vector features carry lerobot ``names``: the task's
    (``TaskSpec.obs_names`` / ``act_names``), or a robot's own through ``rename``
    (``{task name: robot name}``). ``fps`` defaults to the task's control rate,
    ``robot_type`` to the task; the language ``task`` is ``TaskSpec.description``.
    Returns ``root``.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    lerobot_dataset = _lerobot_dataset_cls()
    spec, root = TASKS[task], Path(root)
    ds = lerobot_dataset.create(
        repo_id=f"local/{root.name}",
        fps=round(fps or spec.fps),
        features=lerobot_features(task, rename),
        root=root,
        robot_type=robot_type or task,
        use_videos=False,
        video_backend="pyav",
    )
    for ep in demos:
        add_lerobot_episode(ds, ep, task)
    ds.finalize()
    return root


def _feature_names(key: str, ft: dict[str, Any]) -> list[str] | None:
    """A vector feature's entry names (lerobot writes a list, or ``{"motors": [...]}``)."""
    names = ft.get("names")
    if isinstance(names, dict):
        names = [n for group in names.values() for n in group]
    shape = tuple(ft.get("shape") or ())
    if not names or len(shape) != 1 or len(names) != shape[0]:
        return None
    return [str(n) for n in names]


def dataset_root(path: str | os.PathLike) -> Path:
    """The LeRobotDataset folder of ``path``: itself, or for an experience store (a run's
    ``experience/`` or a fleet's store, holding ``store.json``) its current view."""
    path = Path(path)
    if (path / "store.json").is_file() and (path / "current").exists():
        return (path / "current").resolve()
    return path


def open_lerobot_dataset(
    root: str | os.PathLike | None = None,
    repo_id: str | None = None,
    episodes: Sequence[int] | None = None,
) -> Any:
    """A ``LeRobotDataset`` from a local ``root`` and / or a Hub ``repo_id`` (read from
    lerobot's cache, ``HF_LEROBOT_HOME``, when it is there); a missing one is named."""
    if root is None and repo_id is None:
        raise ValueError("a LeRobotDataset needs a path (root) or a repo_id")
    lerobot_dataset = _lerobot_dataset_cls()
    if root is not None:
        root = dataset_root(root)
        if not (root / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"{root}: not a LeRobotDataset (no meta/info.json)")
    try:
        return lerobot_dataset(
            repo_id or f"local/{Path(root).name}",
            root=root,
            episodes=list(episodes) if episodes is not None else None,
            video_backend="pyav",
        )
    except Exception as exc:  # hub / cache errors of many kinds: say which data set
        raise ValueError(f"cannot open LeRobotDataset {repo_id or root}: {exc}") from exc


def dataset_names(ds: Any, rename: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The (renamed) entry names of every named vector feature of a LeRobotDataset."""
    rename = rename or {}
    out = {}
    for key, ft in ds.meta.features.items():
        names = _feature_names(key, ft)
        if names is not None:
            out[key] = [rename.get(n, n) for n in names]
    return out


def load_lerobot_dataset(
    root: str | os.PathLike | None = None,
    task: str | None = None,
    repo_id: str | None = None,
    rename: dict[str, str] | None = None,
    episodes: Sequence[int] | None = None,
) -> list[Episode]:
    """Read a LeRobotDataset into episodes of ``task``, matching features by name.

    Any ``robot_type`` and layout: the task's observation entries (``TaskSpec.obs_names``)
    are found by name among the ``names`` of the data set's ``observation.*`` vector
    features, its actions among those of ``action``, after ``rename`` (``{dataset name:
    task name}``); a name not found is an error listing the data set's names. ``task``
    defaults to the data set's ``robot_type`` when that is a task. Rewards come from
    ``next.reward`` (required: the critics learn from them), success from ``next.success``,
    the end from ``next.terminated`` / ``next.done``, contact force from
    ``next.contact_force`` (else the next frame's ``contact_force`` entry) and the episode's
    last observation from ``next.observation`` when the data set has it (else the last
    frame's). A data set written by :func:`write_lerobot_dataset` round-trips exactly;
    ``metrics`` are recomputed (``return`` as the float32 sum of the rewards).
    """
    ds = open_lerobot_dataset(root, repo_id, episodes)
    where = repo_id or str(root)
    task = _task_of(ds, task, where)
    spec = TASKS[task]
    located, act_names = _locate(ds, spec, dataset_names(ds, rename), where, task)
    ep_index, fr = _frames(ds, spec, located, act_names)
    return [_episode(fr, np.flatnonzero(ep_index == e), spec, task) for e in np.unique(ep_index)]


def _task_of(ds: Any, task: str | None, where: str) -> str:
    """The task the data maps onto: ``task``, else the data set's ``robot_type``."""
    if task is None:
        task = ds.meta.robot_type
        if task not in TASKS:
            raise ValueError(
                f"{where}: robot_type {task!r} is not a task; say which task the data maps "
                f"onto (data.task / task=): {sorted(TASKS)}"
            )
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    return task


def _locate(
    ds: Any, spec: Any, names: dict[str, list[str]], where: str, task: str
) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """Where each of the task's observation entries is (feature, index; the first by name)
    and the data set's action names; errors name what is missing."""
    located: dict[str, tuple[str, int]] = {}
    for key, entries in names.items():
        if key.startswith("observation."):
            for i, n in enumerate(entries):
                located.setdefault(n, (key, i))
    missing = [n for n in spec.obs_names if n not in located]
    if missing:
        have = [n for k, v in names.items() if k.startswith("observation.") for n in v]
        raise ValueError(
            f"{where}: no observation feature named {missing} for task {task} (the data set "
            f"has {have}); map names with data.rename (dataset name -> task name)"
        )
    act_names = names.get("action", [])
    missing = [n for n in spec.act_names if n not in act_names]
    if missing:
        raise ValueError(
            f"{where}: no action named {missing} for task {task} (the data set's actions are "
            f"{act_names}); map names with data.rename"
        )
    if "next.reward" not in ds.meta.features:
        raise ValueError(
            f"{where}: no next.reward column; the algorithms' critics learn from the "
            "demonstrations' rewards (record them, as lerobot's gym_manipulator does)"
        )
    return located, act_names


@dataclass
class _Frames:
    """A data set's frames in episode order, on the task's layout (``None``: no column)."""

    frames: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    success: np.ndarray | None
    terminated: np.ndarray
    next_obs: np.ndarray | None
    quality: np.ndarray
    forces: np.ndarray | None
    force_column: bool  # ``next.contact_force`` recorded (else the next frame's reading)
    fleet: dict[str, np.ndarray]


def _frames(
    ds: Any, spec: Any, located: dict[str, tuple[str, int]], act_names: list[str]
) -> tuple[np.ndarray, _Frames]:
    cols = ds.hf_dataset.with_format("numpy")[:]
    ep_index = np.asarray(cols["episode_index"]).reshape(-1)
    order = np.lexsort((np.asarray(cols["frame_index"]).reshape(-1), ep_index))

    def col(name: str) -> np.ndarray:
        return np.stack(list(cols[name]))[order]

    def has(name: str) -> bool:
        return name in ds.meta.features

    vectors = {key: col(key).astype(np.float32) for key in {k for k, _ in located.values()}}
    rewards = col("next.reward").reshape(-1)
    n = len(rewards)
    end = "next.terminated" if has("next.terminated") else "next.done"
    next_obs = col("next.observation") if has("next.observation") else None
    if next_obs is not None and next_obs.shape[1:] != (spec.obs_dim,):
        next_obs = None  # someone else's next.observation: not the task's vector
    forces = None
    if spec.has_force:
        if has("next.contact_force"):
            forces = col("next.contact_force").reshape(-1)
        elif "contact_force" in spec.obs_names:
            forces = np.empty(n, np.float32)  # the next frame's reading, per episode
    return ep_index[order], _Frames(
        frames=np.stack([vectors[k][:, i] for k, i in (located[m] for m in spec.obs_names)], 1),
        actions=col("action")[:, [act_names.index(m) for m in spec.act_names]],
        rewards=rewards,
        success=col("next.success").reshape(-1).astype(bool) if has("next.success") else None,
        terminated=col(end).reshape(-1).astype(bool) if has(end) else np.zeros(n, bool),
        next_obs=next_obs,
        quality=col("quality").reshape(-1) if has("quality") else np.zeros(n, np.int64),
        forces=forces,
        force_column=has("next.contact_force"),
        fleet={name: col(name).reshape(-1) for name in FLEET_COLUMNS if has(name)},
    )


def _episode(fr: _Frames, sel: np.ndarray, spec: Any, task: str) -> Episode:
    """The episode of frames ``sel``."""
    obs = np.empty((len(sel) + 1, spec.obs_dim), dtype=np.float32)
    obs[:-1] = fr.frames[sel]
    obs[-1] = fr.next_obs[sel[-1]] if fr.next_obs is not None else fr.frames[sel[-1]]
    f = None
    if fr.forces is not None:
        if not fr.force_column:
            fr.forces[sel] = obs[1:, spec.obs_names.index("contact_force")]
        f = fr.forces[sel].astype(np.float32)
    r = fr.rewards[sel].astype(np.float32)
    known = fr.success is not None  # no next.success column: unknown, not failed
    s = fr.success[sel] if known else np.zeros(len(sel), bool)
    metrics = {
        "return": float(r.sum()),
        "length": len(sel),
        "success": bool(s[-1]) if known else None,
        "ever_success": bool(s.any()) if known else None,
        "peak_force": float(f.max()) if f is not None else None,
        "frac_force_above": float(np.mean(f > spec.force_threshold)) if f is not None else None,
    }
    fleet, first = fr.fleet, sel[0]
    codes = {v: k for k, v in _QUALITY_CODES.items()}

    def at_start(name: str) -> int:  # a fleet column's value for the episode (-1: none)
        return int(fleet[name][first]) if name in fleet else -1

    return Episode(
        obs=obs,
        actions=fr.actions[sel].astype(np.float32),
        rewards=r,
        success=bool(s[-1]),
        metrics=metrics,
        terminated=bool(fr.terminated[sel[-1]]),
        step_success=s if known else None,
        contact_force=f,
        quality=codes.get(int(fr.quality[first]), ""),
        task=task,
        intervention=fleet["intervention"][sel].astype(bool) if "intervention" in fleet else None,
        policy_version=at_start("policy_version"),
        robot=at_start("robot_index"),
        episode_id=at_start("episode_id"),
    )
