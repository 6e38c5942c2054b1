"""``rlpost-robot fleet``: the run around :class:`~rlpost.robot.fleet.runtime.FleetRuntime`.

:func:`run_fleet` claims the run directory, evaluates the BC policy on every robot variant
(held-out seeds, no operator), runs the fleet for its budget, evaluates the final policy
the same way, and writes:

* ``store/``: the fleet's episodes (``store/current`` is a LeRobotDataset);
* ``checkpoints/``: the learner's (``--resume`` continues from the newest);
* ``metrics.jsonl`` (+ TensorBoard): one row per policy version;
* ``fleet.png``: fleet success (episodes without an intervention that succeed) and the
  intervention rate against the experience collected, and success per variant before
  and after;
* ``policy/``: the final policy (``FlowChunkPolicy.load``), and ``fleet.json``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["evaluate_variants", "format_fleet", "run_fleet"]

#: what ``--overwrite`` deletes besides the core's run outputs
FLEET_OUTPUTS = ("store", "robots", "policies", "policy", "fleet_state.json", "eval_before.json")


def evaluate_variants(
    task: str,
    policy: Any,
    variants: list[Any],
    episodes: int,
    sample_steps: int,
    seed: int = 10_000,
    workdir: str | Path = ".",
) -> dict[str, float]:
    """Success rate of ``policy`` on each variant over ``episodes`` held-out episodes
    (seeds ``seed, seed + 1, ...``), with no operator: what the policy does alone."""
    from rlpost.robot.fleet.robot import FleetRobot

    out = {}
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    for v in variants:
        sim = {"type": "rlpost_mujoco", "params": {"variant": v.to_dict()}}
        bot = FleetRobot(
            -1, task, sim, policy.cfg.to_dict(), sample_steps, {"enabled": False}, 0.0,
            seed, str(workdir), threads=0,
        )  # fmt: skip
        bot.load(state, 0)
        out[v.name] = float(np.mean([bot.run(-1, seed + j, 0).success for j in range(episodes)]))
        bot.close()
    return out


def _claim(job: Any, resume: bool, overwrite: bool) -> Path:
    """The run directory, locked before anything in it is touched: ``--overwrite`` of a
    live fleet is refused, naming its process, with nothing deleted."""
    from rlpost.core.io.rundir import lock_run_dir, open_run_dir

    out = Path(job.run.dir)
    out.mkdir(parents=True, exist_ok=True)
    lock_run_dir(out)
    if overwrite:
        for name in FLEET_OUTPUTS:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    store = out / "store" / "spool"
    if not resume and not overwrite and store.is_dir() and any(store.iterdir()):
        raise ValueError(
            f"run.dir {out} holds a fleet's store: pass --resume to continue the run, "
            "--overwrite to replace it, or choose another run.dir"
        )
    return open_run_dir(out, job, resume=resume, overwrite=overwrite)


def run_fleet(
    job: Any, resume: bool = False, overwrite: bool = False, until: Any = None
) -> dict[str, Any]:
    """The fleet run of ``job`` (a :class:`rlpost.robot.config.FleetJob`); see the module
    docstring. ``until(runtime)``: an extra stop condition (tests)."""
    import torch

    from rlpost.core.io.metrics import MetricsLogger, read_metrics
    from rlpost.robot.fleet.runtime import FleetRuntime
    from rlpost.robot.policies.flow import FlowChunkPolicy

    if job.run.threads:
        torch.set_num_threads(job.run.threads)
    out = _claim(job, resume, overwrite).resolve()  # actors may run in another directory
    t0 = time.perf_counter()
    rt = FleetRuntime(job, out, resume=resume, progress=job.run.progress)
    steps = job.learner.algo_config(job.run.seed).sample_steps  # the robots' sampling
    variants = rt.variants
    before_file = out / "eval_before.json"
    if before_file.is_file():
        before = json.loads(before_file.read_text())
    else:
        bc = FlowChunkPolicy.load(Path(rt.policy_dir) / "policy")
        before = evaluate_variants(
            job.task, bc, variants, job.fleet.eval_episodes, steps,
            workdir=out / "robots",
        ) if job.fleet.eval_episodes else {}  # fmt: skip
        before_file.write_text(json.dumps(before, indent=1))
    rows = read_metrics(out) if resume and (out / "metrics.jsonl").is_file() else []
    logger = MetricsLogger.for_run(out, job.run, rows[-1]["step"] if rows else None)
    try:
        rt.start()
        rt.run(log=lambda row: logger.log(int(row["version"]), row), until=until)
        info = rt.finish()
        final = FlowChunkPolicy.load(Path(rt.policy_dir) / "policy")
        final.load_state_dict(rt.final_weights)
    finally:
        logger.close()
        rt.close()
    final.save(out / "policy")
    after = evaluate_variants(
        job.task, final, variants, job.fleet.eval_episodes, steps,
        workdir=out / "robots",
    ) if job.fleet.eval_episodes else {}  # fmt: skip
    curve = experience_curve(rt.store)
    result = {
        "task": job.task,
        "robots": job.fleet.robots,
        "minutes": job.fleet.minutes,
        "realtime": job.fleet.realtime,
        "episodes": len(rt.store),
        "steps": int(sum(c["length"] for c in curve["episodes"])),
        "interventions": int(sum(c["intervened"] for c in curve["episodes"])),
        "algo": job.learner.algo,
        "version": rt.version,
        "updates": info.get("updates"),
        "accepted": info.get("accepted"),
        "stale": info.get("stale"),
        "robot_restarts": rt.robot_restarts,
        "learner_restarts": rt.learner_restarts,
        "store_recovery": rt.recovery,
        "eval_episodes": job.fleet.eval_episodes,
        "before": before,
        "after": after,
        "curve": curve["rolling"],
        "dataset": str(rt.store.current),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    _plot(result, out / "fleet.png")
    (out / "fleet.json").write_text(json.dumps(result, indent=1))
    return result


def experience_curve(store: Any, window: int = 50) -> dict[str, Any]:
    """Per stored episode: success, whether a human intervened, length; and the rolling
    fleet success (no intervention, success) and intervention rate over ``window``."""
    eps = [
        {
            "success": bool(e.success),
            "intervened": bool(e.intervention is not None and e.intervention.any()),
            "length": len(e),
            "version": e.policy_version,
            "robot": e.robot,
        }
        for e in store.read()
    ]
    auto = np.array([e["success"] and not e["intervened"] for e in eps], dtype=float)
    human = np.array([e["intervened"] for e in eps], dtype=float)
    rolling = []
    for end in range(window, len(eps) + 1, max(1, window // 5)):
        rolling.append(
            {
                "episodes": end,
                "success": float(auto[end - window : end].mean()),
                "interventions": float(human[end - window : end].mean()),
            }
        )
    return {"episodes": eps, "rolling": rolling}


def format_fleet(r: dict[str, Any]) -> str:
    lines = [
        f"fleet of {r['robots']} robots on {r['task']} for {r['minutes']} min "
        f"(simulation at {r['realtime']}x real time): {r['episodes']} episodes, "
        f"{r['steps']} steps, {r['interventions']} with an intervention",
        f"learner ({r.get('algo', 'lwd')}): policy v{r['version']}, {r['updates']} updates, "
        f"{r['accepted']} episodes "
        f"trained on, {r['stale']} too stale; restarts: {r['robot_restarts']} robot, "
        f"{r['learner_restarts']} learner",
    ]
    if r["before"]:
        lines.append(
            f"success without intervention, {r['eval_episodes']} held-out episodes per variant:"
        )
        lines.append(f"{'variant':<20}{'BC':>8}{'after':>8}")
        for name, b in r["before"].items():
            lines.append(f"{name:<20}{b:>8.2f}{r['after'].get(name, float('nan')):>8.2f}")
        mb, ma = np.mean(list(r["before"].values())), np.mean(list(r["after"].values()))
        lines.append(f"{'mean':<20}{mb:>8.2f}{ma:>8.2f}")
    lines.append(f"store: {r['dataset']} (LeRobotDataset); time {r['seconds']} s")
    return "\n".join(lines)


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    if r["curve"]:
        x = [c["episodes"] for c in r["curve"]]
        ax.plot(x, [c["success"] for c in r["curve"]], "-", label="success, no intervention")
        ax.plot(x, [c["interventions"] for c in r["curve"]], "--", label="intervention rate")
        ax.legend(fontsize=8)
    ax.set(xlabel="fleet experience (episodes)", ylabel="rate (last 50 episodes)", ylim=(0, 1.02))
    ax.set_title(f"{r['robots']} robots, {r['episodes']} episodes", fontsize=10)
    ax.grid(alpha=0.3)
    ax = axes[1]
    names = list(r["before"])
    xs = np.arange(len(names))
    ax.bar(xs - 0.2, [r["before"][n] for n in names], 0.4, label="BC")
    ax.bar(xs + 0.2, [r["after"].get(n, 0) for n in names], 0.4, label="after the fleet")
    ax.set_xticks(xs, names, rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="held-out success", ylim=(0, 1.02))
    ax.set_title("per robot variant (no intervention)", fontsize=10)
    if names:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
