"""The robot domain's other jobs: ``rlpost-robot residual``, ``deploy``, ``record``, ``eval``.

* :func:`run_residual`: the offline residual RL corrector (catalog 004-03) trained on a base
  decoder's trajectories, measured on held-out ones against the supervised residual;
* :func:`run_deploy`: a policy (a ``rlpost-robot train`` run's, or the cached BC policy)
  drives a robot through lerobot's ``Robot`` interface, built by lerobot's
  ``make_robot_from_config`` from the recipe's ``robot.type`` (``rlpost_mujoco``, our
  simulated tasks, or any arm lerobot supports);
* :func:`run_record`: scripted demonstrations written as a LeRobotDataset named like a
  robot's features (a stand-in for ``lerobot-record`` on an arm);
* :func:`evaluate_run`: a trained run's policy evaluated on its simulated task.

``residual`` and ``deploy`` write into ``run.dir`` (``config.yaml``, a JSON summary,
``metrics.jsonl``, a plot), ``record`` its data set there; ``eval`` writes nothing. A
``run.dir`` that already holds a run is refused unless ``overwrite`` (``--overwrite``)
replaces it (see :func:`rlpost.core.io.rundir.open_run_dir`). They are short: no
checkpoints, no resume.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def _start(job: Any, overwrite: bool = False) -> Path:
    import torch

    from rlpost.core.io.rundir import open_run_dir

    if job.run.threads:
        torch.set_num_threads(job.run.threads)
    return open_run_dir(job.run.dir, job, overwrite=overwrite)


# ------------------------------------------------------------------------ residual


def run_residual(job: Any, overwrite: bool = False) -> dict[str, Any]:
    """Train the residual RL agent and the supervised residual on ``job.data.train``
    synthetic trajectories; Pearson r and RMSE (mean over axes) of the base decoder and
    of both corrections on ``job.data.test`` held-out ones. Writes ``agent/``
    (safetensors), ``metrics.jsonl`` (the agent's training log), ``residual.json`` and
    ``trajectory.png``; ``overwrite`` replaces a run already in ``run.dir``."""
    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.robot.algos.residual import (
        pearson_r,
        rmse,
        supervised_residual,
        synthetic_decoding_data,
        train_residual_rl,
    )

    out = _start(job, overwrite)
    cfg, d, seed = job.agent_config(), job.data, job.run.seed
    train = synthetic_decoding_data(d.train, d.steps, seed=2 * seed)
    test = synthetic_decoding_data(d.test, d.steps, seed=2 * seed + 1)
    t0 = time.perf_counter()
    logger = MetricsLogger.for_run(out, job.run)
    try:
        agent, _ = train_residual_rl(
            train, cfg, log=lambda row: logger.log(row["step"], row), progress=job.run.progress
        )
    finally:
        logger.close()
    supervised = supervised_residual(train, cfg)
    seconds = time.perf_counter() - t0
    agent.save(out / "agent")
    rows = {}
    for name, traj in (
        ("base decoder", test.pred),
        ("+ residual RL", agent.correct(test.pred)),
        ("+ supervised residual", supervised.correct(test.pred)),
    ):
        rows[name] = {
            "r": pearson_r(traj, test.target).mean().item(),
            "rmse": rmse(traj, test.target).mean().item(),
        }
    result = {"rows": rows, "test_trajectories": d.test, "seconds_train": round(seconds, 1)}
    _plot_trajectory(test, agent, out / "trajectory.png")
    (out / "residual.json").write_text(json.dumps(result, indent=1))
    return result


def format_residual(result: dict[str, Any]) -> str:
    base = result["rows"]["base decoder"]
    lines = [
        f"held-out trajectories: {result['test_trajectories']} (mean over axes)",
        f"{'':<24}{'Pearson r':>10}{'RMSE':>8}{'r gain':>8}{'RMSE cut':>10}",
    ]
    for name, m in result["rows"].items():
        gain = m["r"] / base["r"] - 1
        cut = 1 - m["rmse"] / base["rmse"]
        lines.append(f"{name:<24}{m['r']:>10.3f}{m['rmse']:>8.3f}{gain:>8.0%}{cut:>10.0%}")
    lines.append(f"time: {result['seconds_train']} s")
    return "\n".join(lines)


def _plot_trajectory(test: Any, agent: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corrected = agent.correct(test.pred[:1])[0, :, 0]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(test.target[0, :, 0], label="target", color="black")
    ax.plot(test.pred[0, :, 0], label="base decoder", alpha=0.7)
    ax.plot(corrected, label="+ residual RL", alpha=0.9)
    ax.set(xlabel="time step", ylabel="axis 0", title="a held-out trajectory")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------- deploy


def make_robot(job: Any) -> Any:
    """The lerobot robot of ``job.robot`` (``type`` + ``params``), not connected."""
    return build_robot(
        job.robot.type, job.robot.params, job.task, job.run.seed, Path(job.run.dir) / "calibration"
    )


def build_robot(
    kind: str, params: dict[str, Any], task: str, seed: int, calibration_dir: Path
) -> Any:
    """A lerobot robot of type ``kind`` (``rlpost_mujoco`` or any arm lerobot supports)
    built by lerobot's ``make_robot_from_config`` from ``params`` (its config's fields;
    ``task``, ``seed`` and ``calibration_dir`` fill in those fields when the config has
    them and ``params`` does not), not connected."""
    import importlib
    import pkgutil

    import lerobot.robots
    from lerobot.robots import RobotConfig
    from lerobot.robots.utils import make_robot_from_config

    import rlpost.robot.lerobot_robot  # noqa: F401 - registers rlpost_mujoco

    if kind not in RobotConfig.get_known_choices():  # lerobot registers its arms on import
        for m in pkgutil.iter_modules(lerobot.robots.__path__):
            if m.ispkg:
                try:
                    importlib.import_module(f"lerobot.robots.{m.name}")
                except ImportError:  # an arm whose SDK is not installed
                    continue
    known = RobotConfig.get_known_choices()
    if kind not in known:
        raise ValueError(f"robot.type: unknown lerobot robot {kind!r}; known: {sorted(known)}")
    cls = known[kind]
    params = dict(params)
    fields = getattr(cls, "__dataclass_fields__", {})
    for name, value in (("task", task), ("seed", seed), ("calibration_dir", calibration_dir)):
        if name in fields:
            params.setdefault(name, value)
    try:
        config = cls(**params)
    except TypeError as exc:
        raise ValueError(f"robot.params: {exc}") from None
    return make_robot_from_config(config)


def _deploy_policy(job: Any) -> tuple[Any, str, Any]:
    """The policy to deploy, its :data:`~rlpost.robot.policies.kinds.POLICY_KINDS` kind and its
    :class:`~rlpost.robot.features.FeatureMap` (the run's ``policy/features.json``: the
    names of the data it was trained on; else the task's)."""
    from rlpost.robot.features import FeatureMap
    from rlpost.robot.pretrain import build_demo_dataset, load_bc_policy, policy_kind

    p = job.policy
    if p.run is not None:
        folder = Path(p.run)
        if not (folder / "policy" / "config.json").is_file():
            raise FileNotFoundError(f"policy.run: no policy/ in {folder} (a train run dir)")
    else:
        demos = job.demos.model_dump()
        build_demo_dataset(job.task, **demos)
        folder = p.build(job.task, demos, job.run.progress)
    features = FeatureMap.load(folder / "policy", job.task)
    return load_bc_policy(folder), policy_kind(folder), features


def run_deploy(job: Any, overwrite: bool = False) -> dict[str, Any]:
    """Connect the robot, run ``job.episodes`` episodes of the policy through
    :func:`rlpost.robot.lerobot_robot.deploy`, disconnect. Observations and actions are
    matched to the robot's features by name (the policy's ``features.json``); a robot
    lacking one is refused before it moves. Writes ``deploy.json``, ``metrics.jsonl`` (one
    row per episode) and ``deploy.png``; ``overwrite`` replaces a run already in
    ``run.dir``."""
    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.robot.lerobot_robot import deploy
    from rlpost.robot.policies.bc import ChunkController
    from rlpost.robot.policies.kinds import POLICY_KINDS

    out = _start(job, overwrite)
    policy, kind, features = _deploy_policy(job)
    policy.eval()
    robot = make_robot(job)
    features.check(robot.observation_features, robot.action_features, f"robot {job.robot.type!r}")
    multi = POLICY_KINDS[kind]
    ctrl = ChunkController(
        policy,
        execute=job.policy.execute or policy.cfg.horizon,
        n_steps=job.policy.sample_steps if multi.multi_step else None,
        seed=job.run.seed,
    )
    t0 = time.perf_counter()
    robot.connect()
    try:
        episodes = deploy(ctrl, robot, job.episodes, job.max_steps, job.run.seed, features)
    finally:
        robot.disconnect()
    logger = MetricsLogger.for_run(out, job.run)
    try:
        for i, ep in enumerate(episodes):
            logger.log(i, {k: v for k, v in ep.items() if v is not None})
    finally:
        logger.close()
    result = {
        "task": job.task,
        "robot": job.robot.type,
        "policy": f"{kind} policy of {job.policy.run}" if job.policy.run else f"BC {kind} policy",
        "episodes": episodes,
        "success": sum(e["success"] for e in episodes) / len(episodes),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    _plot_deploy(result, out / "deploy.png")
    (out / "deploy.json").write_text(json.dumps(result, indent=1))
    return result


def format_deploy(result: dict[str, Any]) -> str:
    lines = [
        f"{result['policy']} on robot {result['robot']} ({result['task']}): "
        f"success {result['success']:.0%} over {len(result['episodes'])} episodes",
        f"{'episode':<9}{'steps':>6}{'success':>9}{'peak force':>12}{'mean force':>12}",
    ]
    for i, e in enumerate(result["episodes"]):
        peak = "-" if e["peak_force"] is None else f"{e['peak_force']:.1f} N"
        mean = "-" if e["mean_force"] is None else f"{e['mean_force']:.1f} N"
        lines.append(f"{i:<9}{e['steps']:>6}{e['success']!s:>9}{peak:>12}{mean:>12}")
    lines.append(f"time: {result['seconds']} s")
    return "\n".join(lines)


def _plot_deploy(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = result["episodes"]
    fig, ax = plt.subplots(figsize=(6, 3))
    colors = ["tab:green" if e["success"] else "tab:red" for e in eps]
    ax.bar(range(len(eps)), [e["steps"] for e in eps], color=colors)
    ax.set(xlabel="episode", ylabel="steps (green: success)", title=result["policy"])
    if eps and eps[0]["peak_force"] is not None:
        ax2 = ax.twinx()
        ax2.plot(range(len(eps)), [e["peak_force"] for e in eps], "ko-", label="peak force")
        ax2.set_ylabel("peak contact force (N)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------- record


def run_record(job: Any, overwrite: bool = False) -> dict[str, Any]:
    """Collect ``job.demos`` scripted episodes of ``job.task`` and write them to
    ``run.dir/dataset`` as a LeRobotDataset with ``robot_type`` and the features renamed
    by ``job.rename``; writes ``record.json``. Read back with ``data.path=<run.dir>/dataset``
    and ``data.rename`` mapping the names back onto the task's."""
    from rlpost.robot.demos import collect_demos
    from rlpost.robot.lerobot_data import write_lerobot_dataset

    out = _start(job, overwrite)
    t0 = time.perf_counter()
    demos = collect_demos(job.task, job.demos.n_good, job.demos.n_poor, seed=job.run.seed)
    root = write_lerobot_dataset(
        demos, out / "dataset", job.task, robot_type=job.robot_type, rename=job.rename
    )
    result = {
        "task": job.task,
        "dataset": str(root),
        "robot_type": job.robot_type,
        "episodes": len(demos),
        "frames": sum(len(d.actions) for d in demos),
        "success": sum(d.success for d in demos) / len(demos),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "record.json").write_text(json.dumps(result, indent=1))
    return result


def format_record(result: dict[str, Any]) -> str:
    return (
        f"recorded {result['episodes']} episodes ({result['frames']} frames, "
        f"{result['success']:.0%} succeed) of {result['task']} as robot "
        f"{result['robot_type']!r}: {result['dataset']}"
    )


# -------------------------------------------------------------------------- eval


def evaluate_run(
    run_dir: str | Path,
    episodes: int = 100,
    seed: int = 10_000,
    steps: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate the policy of a ``rlpost-robot train`` run on its simulated task:
    ``episodes`` fresh episodes from ``seed`` (the train command's evaluation uses
    10,000), with ``steps`` integration steps (a flow policy; default the run's
    ``run.eval_steps``); ``progress``: a bar per step count. Reads the run, writes
    nothing."""
    from rlpost.robot.algos.common import evaluate_policy
    from rlpost.robot.config import load_config
    from rlpost.robot.pretrain import load_bc_policy
    from rlpost.robot.train import evaluation_steps

    run = Path(run_dir)
    if not (run / "policy" / "config.json").is_file() or not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run}: not a finished rlpost-robot train run (no policy/)")
    cfg = load_config(run / "config.yaml")
    kind = cfg.policy.kind
    policy = load_bc_policy(run).eval()
    all_steps = evaluation_steps(cfg)
    if steps is not None and len(all_steps) > 1:  # a kind that integrates
        all_steps = (steps,)
    t0 = time.perf_counter()
    rows = {
        str(n): evaluate_policy(
            policy, cfg.task, episodes, n, seed=seed,
            progress=f"evaluating ({n} step{'s' * (n != 1)})" if progress else None,
        )
        for n in all_steps
    }  # fmt: skip
    return {
        "run": str(run),
        "task": cfg.task,
        "policy": kind,
        "episodes": episodes,
        "seed": seed,
        "by_steps": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def format_eval(result: dict[str, Any]) -> str:
    lines = [
        f"{result['policy']} policy of {result['run']} on {result['task']}: "
        f"{result['episodes']} episodes from seed {result['seed']}",
        f"{'steps':<8}{'success':>9}{'return':>9}{'peak force':>12}",
    ]
    for n, m in result["by_steps"].items():
        force = f"{m['peak_force']:.1f} N" if "peak_force" in m else "-"
        lines.append(f"{n:<8}{m['success']:>9.2f}{m['return']:>9.2f}{force:>12}")
    lines.append(f"time: {result['seconds']} s")
    return "\n".join(lines)
