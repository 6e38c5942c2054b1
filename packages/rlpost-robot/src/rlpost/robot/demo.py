"""The ``rlpost-robot demo`` job: OTQL fine-tunes a BC flow policy from its own experience.

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

import json
import time
from pathlib import Path
from typing import Any

STEPS = (10, 3, 1)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    x = range(len(STEPS))
    for off, key, label in ((-0.2, "before", "BC"), (0.2, "after", "after OTQL")):
        axes[0].bar([i + off for i in x], [result[key][str(n)] for n in STEPS], 0.4, label=label)
    axes[0].set_xticks(list(x), [f"{n} steps" for n in STEPS])
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(0, 1)
    axes[0].set_title("success vs integration steps", fontsize=10)
    axes[0].legend(fontsize=8)
    hist = result["history"]
    axes[1].plot([h["episodes"] for h in hist], [h["online_success"] for h in hist], "o-", ms=3)
    axes[1].set_xlabel("online episodes")
    axes[1].set_ylabel("success of the collected episodes")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("during fine-tuning (10 steps)", fontsize=10)
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
    from rlpost.robot.algos.otql import OTQLConfig, evaluate_policy, run_otql
    from rlpost.robot.pretrain import (
        build_bc_policy,
        build_demo_dataset,
        load_bc_policy,
        load_demos,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bc_kw = {"steps": bc_steps} if bc_steps else {}
    policy = load_bc_policy(build_bc_policy(task, progress=progress, **bc_kw))
    demos = load_demos(build_demo_dataset(task))
    t_build = time.perf_counter() - t0

    def evaluate() -> dict[str, float]:
        return {
            str(n): evaluate_policy(policy, task, eval_episodes, n, seed=10_000)["success"]
            for n in STEPS
        }

    before = evaluate()
    t1 = time.perf_counter()
    cfg = OTQLConfig(episodes=episodes, seed=seed)
    history = run_otql(policy, task, demos, cfg, progress=progress)["history"]
    t_train = time.perf_counter() - t1
    policy.eval()
    after = evaluate()
    policy.save(out / "policy")
    result = {
        "task": task,
        "episodes": episodes,
        "eval_episodes": eval_episodes,
        "demo_success": sum(d.success for d in demos) / len(demos),
        "before": before,
        "after": after,
        "history": history,
        "seconds_build": round(t_build, 1),
        "seconds_otql": round(t_train, 1),
    }
    _plot(result, out / "success.png")
    result["rollout_note"] = _frame_strip(task, policy, out / "rollout.png", seed=10_000)
    (out / "demo.json").write_text(json.dumps(result, indent=1))
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"task {result['task']}: demonstrations succeed {result['demo_success']:.0%}; "
        f"OTQL budget {result['episodes']} episodes; success over {result['eval_episodes']} episodes",
        f"{'integration steps':<20}{'BC':>8}{'after OTQL':>12}",
    ]
    for n in STEPS:
        lines.append(f"{n:<20}{result['before'][str(n)]:>8.2f}{result['after'][str(n)]:>12.2f}")
    lines.append(
        f"time: build/load {result['seconds_build']:.0f} s, OTQL {result['seconds_otql']:.0f} s"
    )
    lines.append(result["rollout_note"])
    return "\n".join(lines)
