"""The embedded defaults of the robot domain: suboptimal demonstrations and a BC flow policy.

``build_demo_dataset(task)`` records the scripted good + poor demonstration mix of
:func:`rlpost.robot.demos.collect_demos` as a local ``LeRobotDataset`` (lerobot extra);
``build_bc_policy(task)`` behaviour-clones a :class:`FlowChunkPolicy` on it. Both are
cached under ``<cache>/robot/`` in folders named by a hash of their recipe, written
atomically (``rlpost.core.io.cache.publish_directory``); a second call returns the cached
result at once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rlpost.core.io.cache import cache_entry, merge_params, publish_directory

#: Bump when a recipe changes in a way that invalidates cached builds.
ROBOT_VERSION = 1

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
    from rlpost.robot.demos import collect_demos, write_lerobot_dataset

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
    from rlpost.robot.demos import load_lerobot_dataset

    return load_lerobot_dataset(Path(path) / "dataset")


def build_bc_policy(
    task: str,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
    demos: dict[str, Any] | None = None,
    **params: Any,
) -> Path:
    """Behaviour-clone a flow policy on ``task``'s demonstration set; returns its folder
    (``policy/`` loadable with :func:`load_bc_policy`, ``bc_info.json``)."""
    import torch

    from rlpost.robot.envs import TASKS
    from rlpost.robot.policies.bc import make_chunks, train_bc
    from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

    recipe = merge_params(BC_DEFAULTS, params)
    demo_recipe = merge_params(DEMO_DEFAULTS, demos or {})
    target = _folder("bc", task, {**recipe, "demos": demo_recipe}, cache_dir)
    if (target / "bc_info.json").is_file() and not force:
        return target
    demo_dir = build_demo_dataset(task, cache_dir, **demo_recipe)

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        episodes = load_demos(demo_dir)
        spec = TASKS[task]
        with torch.random.fork_rng():
            torch.manual_seed(recipe["seed"])
            pi = FlowChunkPolicy(
                FlowPolicyConfig(
                    obs_dim=spec.obs_dim,
                    act_dim=spec.act_dim,
                    horizon=recipe["horizon"],
                    hidden=recipe["hidden"],
                    n_blocks=recipe["n_blocks"],
                )
            )
            obs, chunks, mask = make_chunks(episodes, recipe["horizon"])
            losses = train_bc(
                pi,
                obs,
                chunks,
                mask,
                steps=recipe["steps"],
                batch_size=recipe["batch_size"],
                lr=recipe["lr"],
                seed=recipe["seed"],
                progress=progress,
            )
        pi.save(tmp / "policy")
        info = {
            "task": task,
            **recipe,
            "demos": str(demo_dir),
            "samples": int(obs.shape[0]),
            "final_loss": float(sum(losses[-50:]) / len(losses[-50:])),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / "bc_info.json").write_text(json.dumps(info, indent=1))

    return publish_directory(target, "bc_info.json", write, force)


def load_bc_policy(path: str | os.PathLike):
    """The :class:`FlowChunkPolicy` of a :func:`build_bc_policy` folder (safetensors only)."""
    from rlpost.robot.policies.flow import FlowChunkPolicy

    return FlowChunkPolicy.load(Path(path) / "policy")
