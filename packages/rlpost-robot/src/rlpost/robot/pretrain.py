"""The embedded defaults of the robot domain: suboptimal demonstrations and a BC flow policy.

``build_demo_dataset(task)`` records the scripted good + poor demonstration mix of
:func:`rlpost.robot.demos.collect_demos` as a local ``LeRobotDataset`` (lerobot extra);
``build_bc_policy(task)`` behaviour-clones a :class:`FlowChunkPolicy` on it,
``build_act_policy(task)`` lerobot's ACT (lerobot extra) and ``build_gaussian_policy(task)``
the Gaussian chunk policy of CRAFT. All are
cached under ``<cache>/robot/`` in folders named by a hash of their recipe, written
atomically (``rlpost.core.io.cache.publish_directory``); a second call returns the cached
result at once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlpost.core.io.cache import cache_entry, merge_params, publish_directory
from rlpost.robot.policies.kinds import POLICY_KINDS

#: Bump when a recipe changes in a way that invalidates cached builds.
ROBOT_VERSION = 3

DEMO_DEFAULTS: dict[str, Any] = {"n_good": 10, "n_poor": 30, "seed": 0}
BC_DEFAULTS: dict[str, Any] = {
    "horizon": 4,
    "hidden": 256,
    "n_blocks": 3,
    "steps": 3000,
    "batch_size": 256,
    "lr": 1e-3,
    "seed": 0,
}


def _folder(kind: str, task: str, recipe: dict[str, Any], cache_dir: Any) -> Path:
    key = {"task": task, **recipe, "version": ROBOT_VERSION}
    return cache_entry("robot", f"{kind}-{task}", key, cache_dir)


def build_demo_dataset(
    task: str, cache_dir: str | os.PathLike | None = None, force: bool = False, **params: Any
) -> Path:
    """The demonstration set of ``task`` as a LeRobotDataset; returns its folder.

    Default mix: 10 good and 30 poor scripted episodes (a deliberately suboptimal set).
    """
    from rlpost.robot.demos import collect_demos
    from rlpost.robot.lerobot_data import write_lerobot_dataset

    recipe = merge_params(DEMO_DEFAULTS, params)
    target = _folder("demos", task, recipe, cache_dir)
    if (target / "demos_info.json").is_file() and not force:
        return target

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        demos = collect_demos(task, recipe["n_good"], recipe["n_poor"], seed=recipe["seed"])
        write_lerobot_dataset(demos, tmp / "dataset", task=task)
        info = {
            "task": task,
            **recipe,
            "episodes": len(demos),
            "success_rate": sum(d.success for d in demos) / len(demos),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / "demos_info.json").write_text(json.dumps(info, indent=1))

    return publish_directory(target, "demos_info.json", write, force)


def load_demos(path: str | os.PathLike) -> list[Any]:
    from rlpost.robot.lerobot_data import load_lerobot_dataset

    return load_lerobot_dataset(Path(path) / "dataset")


@dataclass(frozen=True)
class ScriptedDemos:
    """The scripted good + poor demonstration set of ``task`` (built once, cached); what
    ``demos=`` parameters (``n_good``, ``n_poor``, ``seed``) name."""

    task: str
    params: tuple[tuple[str, Any], ...] = ()
    cache_dir: str | os.PathLike | None = None

    def recipe(self) -> dict[str, Any]:
        return merge_params(DEMO_DEFAULTS, dict(self.params))

    def where(self) -> str:
        return str(build_demo_dataset(self.task, self.cache_dir, **self.recipe()))

    def load(self) -> list[Any]:
        return load_demos(self.where())


@dataclass(frozen=True)
class DatasetDemos:
    """Demonstrations from a user's LeRobotDataset (a run config's ``data`` section),
    mapped onto ``task`` by name (:func:`rlpost.robot.lerobot_data.load_lerobot_dataset`).

    Passed wherever the scripted set's parameters (``demos=``) go; the cached BC policy
    is keyed by the data set's :meth:`fingerprint`, so editing the data rebuilds it.
    """

    task: str
    path: str | None = None
    repo_id: str | None = None
    rename: tuple[tuple[str, str], ...] = ()
    episodes: tuple[int, ...] | None = None

    def open(self) -> Any:
        from rlpost.robot.lerobot_data import open_lerobot_dataset

        return open_lerobot_dataset(self.path, self.repo_id, self.episodes)

    def load(self) -> list[Any]:
        from rlpost.robot.lerobot_data import load_lerobot_dataset

        return load_lerobot_dataset(
            self.path, self.task, self.repo_id, dict(self.rename), self.episodes
        )

    def where(self) -> str:
        return str(self.path or self.repo_id)

    def fingerprint(self) -> str:
        """A hash of the data set's files (names, sizes and ``meta/info.json``); a local
        folder is read as it is, a Hub data set opened (downloaded) first."""
        import hashlib

        from rlpost.robot.lerobot_data import dataset_root

        root = dataset_root(self.path) if self.path is not None else Path(self.open().root)
        if not (root / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"{root}: not a LeRobotDataset (no meta/info.json)")
        h = hashlib.sha256((root / "meta" / "info.json").read_bytes())
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(root)}:{f.stat().st_size};".encode())
        return h.hexdigest()[:16]

    def recipe(self) -> dict[str, Any]:
        return {
            "dataset": self.repo_id or Path(self.path).name,
            "fingerprint": self.fingerprint(),
            "rename": dict(self.rename),
            "episodes": list(self.episodes) if self.episodes is not None else None,
        }


def demo_source(
    task: str,
    demos: dict[str, Any] | DatasetDemos | ScriptedDemos | None,
    cache_dir: str | os.PathLike | None = None,
) -> DatasetDemos | ScriptedDemos:
    """``demos`` as a source with ``recipe()`` (the cache key), ``where()`` and ``load()``:
    a user's data set as it is, scripted-set parameters (a dict) as :class:`ScriptedDemos`."""
    if isinstance(demos, DatasetDemos | ScriptedDemos):
        return demos
    return ScriptedDemos(task, tuple(sorted((demos or {}).items())), cache_dir)


def _build_policy(
    kind: str,
    task: str,
    recipe: dict[str, Any],
    demos: dict[str, Any] | DatasetDemos | ScriptedDemos | None,
    cache_dir: str | os.PathLike | None,
    force: bool,
    fit: Any,
) -> Path:
    """Cached behaviour cloning: ``fit(episodes, spec, folder) -> (samples, losses)`` trains
    a ``kind`` policy on the demonstration set and saves it into ``folder``."""
    import torch

    from rlpost.robot.envs import TASKS

    source = demo_source(task, demos, cache_dir)
    target = _folder(
        POLICY_KINDS[kind].cache_name, task, {**recipe, "demos": source.recipe()}, cache_dir
    )
    if (target / "bc_info.json").is_file() and not force:
        return target

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        episodes = source.load()
        with torch.random.fork_rng():
            torch.manual_seed(recipe["seed"])
            samples, losses = fit(episodes, TASKS[task], tmp / "policy")
        info = {
            "task": task,
            "kind": kind,
            **recipe,
            "demos": source.where(),
            "samples": samples,
            "final_loss": float(sum(losses[-50:]) / len(losses[-50:])),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / "bc_info.json").write_text(json.dumps(info, indent=1))

    return publish_directory(target, "bc_info.json", write, force)


def spec_pixels(spec: Any) -> int:
    """Number of image entries at the end of a task's observation (0 without a camera)."""
    return 0 if spec.image_shape is None else int(np.prod(spec.image_shape))


def build_bc_policy(
    task: str,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    demos: dict[str, Any] | DatasetDemos | ScriptedDemos | None = None,
    **params: Any,
) -> Path:
    """Behaviour-clone a flow policy on ``task``'s demonstration set; returns its folder
    (``policy/`` loadable with :func:`load_bc_policy`, ``bc_info.json``). On an image
    task (``TaskSpec.image_shape``) the policy sees the robot's own state entries and the
    camera image, not the world-state entries (``TaskSpec.env_obs``)."""
    from rlpost.robot.policies.bc import make_chunks, train_bc
    from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

    r = merge_params(BC_DEFAULTS, params)

    def fit(episodes: list[Any], spec: Any, folder: Path) -> tuple[int, list[float]]:
        image: dict[str, Any] = {}
        if spec.image_shape is not None:  # the world (goals, objects) is seen in the image
            robot = tuple(
                i for i in range(spec.obs_dim - spec_pixels(spec)) if i not in spec.env_obs
            )
            image = {"image_shape": spec.image_shape, "state_idx": robot}
        pi = FlowChunkPolicy(
            FlowPolicyConfig(
                obs_dim=spec.obs_dim,
                act_dim=spec.act_dim,
                horizon=r["horizon"],
                hidden=r["hidden"],
                n_blocks=r["n_blocks"],
                **image,
            )
        )
        obs, chunks, mask = make_chunks(episodes, r["horizon"])
        kw = {k: r[k] for k in ("steps", "batch_size", "lr", "seed")}
        losses = train_bc(pi, obs, chunks, mask, progress=progress, **kw)
        pi.save(folder)
        return int(obs.shape[0]), losses

    return _build_policy("flow", task, r, demos, cache_dir, force, fit)


ACT_DEFAULTS: dict[str, Any] = {
    "horizon": 8,
    "dim_model": 64,
    "n_layers": 1,
    "steps": 2000,
    "batch_size": 64,
    "lr": 1e-3,
    "seed": 0,
}


def build_act_policy(
    task: str,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    demos: dict[str, Any] | DatasetDemos | ScriptedDemos | None = None,
    **params: Any,
) -> Path:
    """Behaviour-clone lerobot's ACT (lerobot extra) on ``task``'s demonstration set;
    returns its folder (``policy/`` loadable with :func:`load_bc_policy`, ``bc_info.json``)."""
    from rlpost.robot.policies.act import ActChunkPolicy, act_stats, train_act_bc
    from rlpost.robot.policies.bc import make_chunks

    r = merge_params(ACT_DEFAULTS, params)

    def fit(episodes: list[Any], spec: Any, folder: Path) -> tuple[int, list[float]]:
        pi = ActChunkPolicy(
            spec.obs_dim,
            spec.act_dim,
            spec.env_obs,
            horizon=r["horizon"],
            stats=act_stats(episodes, spec.env_obs),
            dim_model=r["dim_model"],
            n_layers=r["n_layers"],
        )
        obs, chunks, mask = make_chunks(episodes, r["horizon"])
        kw = {k: r[k] for k in ("steps", "batch_size", "lr", "seed")}
        losses = train_act_bc(pi, obs, chunks, mask, **kw)
        pi.save(folder)
        return int(obs.shape[0]), losses

    return _build_policy("act", task, r, demos, cache_dir, force, fit)


GAUSSIAN_DEFAULTS: dict[str, Any] = {
    "horizon": 4,
    "hidden": 256,
    "init_std": 0.2,
    "steps": 2000,
    "batch_size": 256,
    "lr": 1e-3,
    "seed": 0,
}


def build_gaussian_policy(
    task: str,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    demos: dict[str, Any] | DatasetDemos | ScriptedDemos | None = None,
    **params: Any,
) -> Path:
    """Behaviour-clone the mean of a Gaussian chunk policy (for CRAFT) on ``task``'s
    demonstration set; returns its folder (loadable with :func:`load_bc_policy`)."""
    from rlpost.robot.policies.bc import make_chunks
    from rlpost.robot.policies.gaussian import GaussianChunkPolicy, train_gaussian_bc

    r = merge_params(GAUSSIAN_DEFAULTS, params)

    def fit(episodes: list[Any], spec: Any, folder: Path) -> tuple[int, list[float]]:
        pi = GaussianChunkPolicy(
            spec.obs_dim, spec.act_dim, r["horizon"], r["hidden"], init_std=r["init_std"]
        )
        obs, chunks, mask = make_chunks(episodes, r["horizon"])
        kw = {k: r[k] for k in ("steps", "batch_size", "lr", "seed")}
        losses = train_gaussian_bc(pi, obs, chunks, mask, **kw)
        pi.save(folder)
        return int(obs.shape[0]), losses

    return _build_policy("gaussian", task, r, demos, cache_dir, force, fit)


# ---------------------------------------------------------------------- policy kinds
# The kinds are registered by their light configuration modules
# (:mod:`rlpost.robot.policies.kinds`); these are their builds: each kind's settings to its
# cached BC policy (the cache keys, and so the cached policies, as before the registry).


def build_flow_kind(task: str, demos: Any, p: Any, progress: bool, force: bool = False) -> Path:
    return build_bc_policy(task, progress=progress, demos=demos, steps=p.bc_steps,
                           horizon=p.horizon, hidden=p.hidden, force=force)  # fmt: skip


def build_act_kind(task: str, demos: Any, p: Any, progress: bool, force: bool = False) -> Path:
    return build_act_policy(task, demos=demos, steps=p.bc_steps, horizon=p.horizon,
                            dim_model=p.dim_model, force=force)  # fmt: skip


def build_gaussian_kind(task: str, demos: Any, p: Any, progress: bool, force: bool = False) -> Path:
    return build_gaussian_policy(task, demos=demos, steps=p.bc_steps, horizon=p.horizon,
                                 hidden=p.hidden, force=force)  # fmt: skip


def policy_kind(path: str | os.PathLike) -> str:
    """The :data:`POLICY_KINDS` entry of a policy folder's ``policy/config.json`` (folders
    written before the kind was recorded hold a flow policy)."""
    folder = Path(path) / "policy"
    kind = json.loads((folder / "config.json").read_text()).get("kind", "flow")
    if kind not in POLICY_KINDS:
        raise ValueError(f"{folder}: unknown policy kind {kind!r}; known: {sorted(POLICY_KINDS)}")
    return kind


def load_bc_policy(path: str | os.PathLike):
    """The policy of a BC policy folder of any kind (:data:`POLICY_KINDS`; the kind is
    read from the saved config; safetensors + JSON only)."""
    return POLICY_KINDS[policy_kind(path)].loader()(Path(path) / "policy")
