"""The ``rlpost-robot demo`` job: OTQL fine-tunes a BC flow policy from its own experience
(the ``otql_<task>`` recipe through :func:`rlpost.robot.train.train_from_config`), and the
result's plot, frame strip and table.

1. Builds (or loads from the cache) the suboptimal demonstration set of ``task`` (10 good
   + 30 poor scripted episodes, a LeRobotDataset) and the BC flow policy cloned from it.
2. Evaluates the BC policy at 10, 3 and 1 integration steps.
3. Runs OTQL for ``episodes`` online episodes and evaluates again.
4. Writes into ``out``: ``success.png`` (success vs integration steps, before / after, and
   the online success during fine-tuning), ``rollout.png`` (a frame strip of one episode
   after fine-tuning, when a renderer is available), ``policy/`` (the fine-tuned policy),
   ``demo.json``; and prints the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STEPS = (10, 3, 1)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = result.get("algo_title", result.get("algo", "OTQL").upper())
    hist = result["history"]
    force = bool(hist) and "peak_force" in hist[0]
    fig, axes = plt.subplots(1, 3 if force else 2, figsize=(13.5 if force else 9, 3.4))
    steps = result.get("steps", STEPS)
    x = range(len(steps))
    for off, key, label in ((-0.2, "before", "BC"), (0.2, "after", f"after {name}")):
        axes[0].bar([i + off for i in x], [result[key][str(n)] for n in steps], 0.4, label=label)
    if len(result.get("steps", STEPS)) > 1:  # a kind that integrates: by steps
        axes[0].set_xticks(list(x), [f"{n} steps" for n in steps])
        axes[0].set_title("success vs integration steps", fontsize=10)
    else:
        axes[0].set_xticks([], [])
        axes[0].set_title(f"success ({result.get('policy')} policy)", fontsize=10)
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(0, 1)
    axes[0].legend(fontsize=8)
    eps = [h["episodes"] for h in hist]
    axes[1].plot(eps, [h["online_success"] for h in hist], "o-", ms=3)
    axes[1].set_xlabel("online episodes")
    axes[1].set_ylabel("success of the collected episodes")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("during fine-tuning (exploring)", fontsize=10)
    if force:
        axes[2].plot(eps, [h["peak_force"] for h in hist], "o-", ms=3, color="C3")
        axes[2].set_xlabel("online episodes")
        axes[2].set_ylabel("mean peak contact force (N)", color="C3")
        twin = axes[2].twinx()
        twin.plot(eps, [h["frac_force_above"] for h in hist], "s--", ms=3, color="C2")
        twin.set_ylabel("fraction of steps above threshold", color="C2")
        axes[2].set_title("force safety during fine-tuning", fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _frame_strip(task: str, policy: Any, path: Path, seed: int) -> str:
    """Render one episode of ``policy`` to a PNG strip; returns a note."""
    from rlpost.robot.envs import render_frames
    from rlpost.robot.policies.bc import ChunkController

    ctrl = ChunkController(policy, execute=policy.cfg.horizon, n_steps=3)
    frames = render_frames(task, ctrl, seed=seed, steps=50)
    if not frames:
        return "no rollout image: no MuJoCo renderer here (set MUJOCO_GL=egl with libEGL)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pick = frames[:: max(1, len(frames) // 8)][:8]
    fig, axes = plt.subplots(1, len(pick), figsize=(1.6 * len(pick), 1.8))
    for i, (ax, fr) in enumerate(zip(axes, pick, strict=True)):
        ax.imshow(fr)
        ax.axis("off")
        ax.set_title(f"t={i * max(1, len(frames) // 8)}", fontsize=7)
    fig.tight_layout(pad=0.2)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"rollout: {path}"


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

    return train_from_config(load_config(path, overrides))


def format_table(result: dict[str, Any]) -> str:
    name = result.get("algo_title", result.get("algo", "OTQL").upper())
    lines = [
        f"task {result['task']}: demonstrations succeed {result['demo_success']:.0%}; "
        f"{name} budget {result['episodes']} episodes; success over {result['eval_episodes']} episodes",
    ]
    if len(result.get("steps", STEPS)) > 1:  # a kind that integrates: by steps
        lines.append(f"{'integration steps':<20}{'BC':>8}{'after ' + name:>12}")
        for n in result.get("steps", STEPS):
            b, a = result["before"][str(n)], result["after"][str(n)]
            lines.append(f"{n:<20}{b:>8.2f}{a:>12.2f}")
    else:
        b, a = (result[k][str(result["steps"][0])] for k in ("before_metrics", "after_metrics"))
        bc = f"BC ({result.get('policy', 'flow')})"
        lines.append(f"{'':<26}{bc:>10}{'after ' + name:>16}")
        rows = [("success", "success", "{:.2f}"), ("return", "return", "{:.2f}")]
        if "peak_force" in b:
            rows += [
                ("peak contact force (N)", "peak_force", "{:.1f}"),
                ("steps above threshold", "frac_force_above", "{:.1%}"),
            ]
        for label, key, fmt in rows:
            lines.append(f"{label:<26}{fmt.format(b[key]):>10}{fmt.format(a[key]):>16}")
    lines.append(
        f"time: build/load {result['seconds_build']:.0f} s, {name} {result['seconds_train']:.0f} s"
    )
    lines.append(result["rollout_note"])
    return "\n".join(lines)
