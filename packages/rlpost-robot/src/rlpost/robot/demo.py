"""The ``rlpost-robot demo`` job: OTQL fine-tunes a BC flow policy from its own experience
(the ``otql_<task>`` recipe through :func:`rlpost.robot.train.train_from_config`).

1. Builds (or loads from the cache) the suboptimal demonstration set of ``task`` (10 good
   + 30 poor scripted episodes, a LeRobotDataset) and the BC flow policy cloned from it.
2. Evaluates the BC policy at 10, 3 and 1 integration steps.
3. Runs OTQL for ``episodes`` online episodes and evaluates again.
4. Writes into ``out``: ``success.png`` (success vs integration steps, before / after, and
   the online success during fine-tuning), ``rollout.png`` (a frame strip of one episode
   after fine-tuning, when a renderer is available), ``policy/`` (the fine-tuned policy),
   ``demo.json``; and prints the table. ``out`` is reused on every call: a run already
   there is replaced (``overwrite``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_demo(
    out: str | Path = "runs/robot-demo",
    task: str = "multimodal_reach",
    episodes: int = 60,
    eval_episodes: int = 100,
    bc_steps: int | None = None,
    progress: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """The shipped ``otql_<task>`` recipe (or ``otql_multimodal_reach`` with the task
    replaced) with the given overrides; see :func:`train_from_config`."""
    from rlpost.robot.config import load_config, recipe_path

    name = f"otql_{task}"
    try:
        path = recipe_path(name)
        overrides = []
    except FileNotFoundError:
        path, overrides = recipe_path("otql_multimodal_reach"), [f"task={task}"]
    overrides += [
        f"run.dir={out}",
        f"algo.params.episodes={episodes}",
        f"run.eval_episodes={eval_episodes}",
        f"run.progress={progress}",
        f"run.seed={seed}",
    ]
    if bc_steps:
        overrides.append(f"policy.bc_steps={bc_steps}")
    from rlpost.robot.train import train_from_config

    return train_from_config(load_config(path, overrides), overwrite=True)
