"""Training entry point of the robot domain: ``rlpost-robot train --config <recipe>``.

:func:`train_from_config` builds (or loads from the cache) the demonstrations and the BC
policy of the config's policy kind, evaluates it, runs the configured algorithm
(:data:`rlpost.robot.algos.ALGORITHMS`) and evaluates again; the trainer holds no
algorithm or policy-kind names; ``rlpost-robot demo`` runs a recipe through it.
:func:`format_table` prints a result; ``success.png`` and ``rollout.png`` show it.

The run directory follows :func:`rlpost.core.io.rundir.open_run_dir`: it is locked, and a
directory that already holds a run is refused unless the run is resumed
(``--resume``: continue from the newest valid checkpoint, exactly) or replaced
(``--overwrite``). Checkpoints are written by the online loop
(:func:`rlpost.robot.algos.common.online_loop`) every ``run.save_every`` rounds and
after the last, into ``run.dir/checkpoints/step-<episodes used>/``; they also hold the
evaluation before fine-tuning, so a resumed run reports the same table. Every algorithm
runs on one typed :class:`~rlpost.robot.algos.base.RunContext`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlpost.core.io.rundir import releases_run_dir


@releases_run_dir(lambda cfg, *args, **kwargs: cfg.run.dir)
def train_from_config(cfg: Any, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Build / load the demonstrations and the BC policy, evaluate, fine-tune, evaluate.

    Writes ``cfg.run.dir``: ``config.yaml``, ``metrics.jsonl`` (one row per round, step =
    the online episodes used), ``checkpoints/`` (every ``run.save_every`` rounds),
    ``success.png``, ``rollout.png`` (when a renderer works), ``policy/``, ``demo.json``.

    ``resume``: continue the run in ``run.dir`` from its newest valid checkpoint (from the
    start when there is none); the result, ``metrics.jsonl`` and the final policy equal
    an uninterrupted run's (bitwise, but for the wall-clock ``seconds``). ``overwrite``:
    replace the run there. With neither, a ``run.dir`` holding a run is refused. The run
    directory is locked for the call and released after.
    """
    import torch

    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.core.io.rundir import open_run_dir, resume_checkpoint
    from rlpost.robot.algos import ALGORITHMS
    from rlpost.robot.algos.base import RunContext
    from rlpost.robot.algos.common import Checkpoints, checkpoint_state, evaluate_policy
    from rlpost.robot.demos import success_rate

    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    # the data set is read (and its errors named) before the run directory is touched
    t0 = time.perf_counter()
    policy = initial_policy(cfg)
    demos = demo_episodes(cfg)
    t_build = time.perf_counter() - t0
    out = open_run_dir(cfg.run.dir, cfg, resume=resume, overwrite=overwrite)
    ckpt = resume_checkpoint(out) if resume else None
    saved = checkpoint_state(ckpt) if ckpt is not None else None
    steps = evaluation_steps(cfg)

    def evaluate(when: str) -> dict[str, dict[str, float]]:
        def bar(n: int) -> str | None:
            steps_said = f" ({n} step{'s' * (n != 1)})" if len(steps) > 1 else ""
            return f"evaluating {when}{steps_said}" if cfg.run.progress else None

        return {
            str(n): evaluate_policy(
                policy, cfg.task, cfg.run.eval_episodes, n, seed=10_000, progress=bar(n)
            )
            for n in steps
        }

    # the BC policy's evaluation is seeded: a resumed run takes it from the checkpoint
    before = (saved or {}).get("run", {}).get("before")
    if before is None or set(before) != {str(n) for n in steps}:
        before = evaluate("before")
    recorder = None
    if cfg.run.experience:
        from rlpost.robot.experience import ExperienceRecorder

        recorder = ExperienceRecorder(out / "experience", cfg.task, saved["step"] if saved else 0)
    checkpoints = Checkpoints(
        out / "checkpoints",
        every=cfg.run.save_every,
        keep=cfg.run.keep_checkpoints,
        resume=ckpt,
        state={"before": before},
        record=recorder,
    )
    t1 = time.perf_counter()
    logger = MetricsLogger.for_run(out, cfg.run, saved["step"] if saved is not None else None)
    algo = ALGORITHMS.get(cfg.algo.name)
    ctx = RunContext(policy, cfg.task, demos, cfg.algorithm_config(),
                     log=lambda row: logger.log(row["episodes"], row),
                     progress=cfg.run.progress, checkpoints=checkpoints)  # fmt: skip
    # torch's global stream from the run's seed, however much the set-up above drew (a
    # cached BC policy draws nothing): a runner that draws from it resumes exactly
    torch.manual_seed(ctx.config.seed)
    try:
        history = algo.runner()(ctx)["history"]
    finally:
        logger.close()
    experience = recorder.finish() if recorder is not None else None
    t_train = time.perf_counter() - t1
    policy.eval()
    after = evaluate("after")
    policy.save(out / "policy")
    policy_features(cfg).save(out / "policy")
    lerobot_copy = save_lerobot_copy(policy, cfg.task, out / "policy" / "lerobot")
    result = {
        "task": cfg.task,
        "algo": cfg.algo.name,
        "algo_title": algo.title,
        "policy": cfg.policy.kind,
        "start": "pretrained" if getattr(cfg.policy.settings, "pretrained", None) else "BC",
        "demos": "data" if cfg.data.given else "scripted",
        "episodes": getattr(cfg.algorithm_config(), algo.episodes_field),
        "eval_episodes": cfg.run.eval_episodes,
        "steps": list(steps),
        "demo_success": success_rate(demos),  # None: the data set records no success
        "before": {k: v["success"] for k, v in before.items()},
        "after": {k: v["success"] for k, v in after.items()},
        "before_metrics": before,
        "after_metrics": after,
        "history": history,
        "seconds_build": round(t_build, 1),
        "seconds_train": round(t_train, 1),
        "lerobot_policy": lerobot_copy,
        "experience": experience,
    }
    _plot(result, out / "success.png")
    result["rollout_note"] = _frame_strip(cfg.task, policy, out / "rollout.png", seed=10_000)
    (out / "demo.json").write_text(json.dumps(result, indent=1))
    from rlpost.core.io.curves import write_summary
    from rlpost.core.io.metrics import read_metrics

    write_summary(
        out, "robot", read_metrics(out), result["seconds_build"] + result["seconds_train"],
        before=result["before_metrics"], after=result["after_metrics"],
        algo=cfg.algo.name, policy=cfg.policy.kind, task=cfg.task,
    )  # fmt: skip
    return result


def policy_features(cfg: Any) -> Any:
    """The names the trained policy reads and writes (``policy/features.json``): the data
    set's own, so that it deploys on the robot that recorded the data (the task's when
    there is no data set or no ``data.rename``)."""
    from rlpost.robot.features import FeatureMap
    from rlpost.robot.lerobot_data import dataset_names

    task = FeatureMap.for_task(cfg.task)
    if not (cfg.data.given and cfg.data.rename):
        return task
    return task.in_data(dataset_names(cfg.demo_source().open()), cfg.data.rename)


def save_lerobot_copy(policy: Any, task: str, path: Path) -> str:
    """A flow policy's lerobot copy (``policy/lerobot/``, type ``rlpost_flow``) when the
    lerobot extra is installed (ACT writes its own in ``save``); says what was written."""
    from rlpost.robot.policies.flow import FlowChunkPolicy

    if not isinstance(policy, FlowChunkPolicy):
        return "written by the policy" if (path / "config.json").is_file() else "none"
    try:
        from rlpost.robot.lerobot_policy import save_flow_lerobot
    except ImportError:
        return "none (pip install 'rlpost-robot[lerobot]' for one)"
    if policy.cfg.image_shape is not None:
        return "none (image-conditioned flows have no lerobot copy yet)"
    save_flow_lerobot(policy, task, path)
    return f"{path} (type rlpost_flow)"


def evaluation_steps(cfg: Any) -> tuple[int, ...]:
    """The integration steps a run is evaluated with: ``run.eval_steps`` for kinds that
    integrate (a flow), one pass otherwise (ACT decodes a chunk at once)."""
    from rlpost.robot.policies.kinds import POLICY_KINDS

    return tuple(cfg.run.eval_steps) if POLICY_KINDS[cfg.policy.kind].multi_step else (1,)


def demo_episodes(cfg: Any) -> list[Any]:
    """The run's demonstrations: the scripted set (built once, cached) or ``data``'s."""
    from rlpost.robot.pretrain import demo_source

    return demo_source(cfg.task, cfg.demo_source()).load()


def build_policy_for(cfg: Any) -> Path:
    """The cached BC policy folder of a run config (its task, demonstrations and policy
    kind, :data:`rlpost.robot.policies.kinds.POLICY_KINDS`); built on first use."""
    return cfg.policy.build(cfg.task, cfg.demo_source(), cfg.run.progress)


def initial_policy(cfg: Any) -> Any:
    """The policy fine-tuning starts from: ``policy.pretrained``'s lerobot ACT checkpoint,
    its inputs placed by the names of ``data``'s features (the task's own split without
    a data set), or else the cached BC policy of :func:`build_policy_for`."""
    from rlpost.robot.pretrain import load_bc_policy

    pretrained = getattr(cfg.policy.settings, "pretrained", None)
    if pretrained is None:
        return load_bc_policy(build_policy_for(cfg))
    from rlpost.robot.envs import TASKS
    from rlpost.robot.lerobot_data import dataset_names, obs_split
    from rlpost.robot.policies.act import ActChunkPolicy

    spec = TASKS[cfg.task]
    if cfg.data.given:
        names = dataset_names(cfg.demo_source().open(), cfg.data.rename)
        idx = []
        for key in ("observation.state", "observation.environment_state"):
            entries = names.get(key, [])
            unknown = [n for n in entries if n not in spec.obs_names]
            if unknown:
                raise ValueError(
                    f"policy.pretrained: {key} of data has {unknown}, not features of task "
                    f"{cfg.task} (map them with data.rename)"
                )
            idx.append(tuple(spec.obs_names.index(n) for n in entries))
        state_idx, env_idx = idx
        if names.get("action") != list(spec.act_names):
            raise ValueError(
                f"policy.pretrained: the data's actions are {names.get('action')}; the "
                f"checkpoint must write the task's {list(spec.act_names)} in that order"
            )
    else:
        state_idx, env_idx = (tuple(int(i) for i in a) for a in obs_split(cfg.task))
    return ActChunkPolicy.from_lerobot(pretrained, spec.obs_dim, spec.act_dim, state_idx, env_idx)


# ------------------------------------------------------------------------ report


def _share(rate: float | None) -> str:
    return "unknown (the data records no next.success)" if rate is None else f"{rate:.0%}"


def format_table(result: dict[str, Any]) -> str:
    name = result["algo_title"]
    lines = [
        f"task {result['task']}: {result.get('demos', 'scripted')} demonstrations succeed "
        f"{_share(result['demo_success'])}; "
        f"{name} budget {result['episodes']} episodes; success over {result['eval_episodes']} episodes",
    ]
    if len(result["steps"]) > 1:  # a kind that integrates: by steps
        lines.append(f"{'integration steps':<20}{'BC':>8}{'after ' + name:>12}")
        for n in result["steps"]:
            b, a = result["before"][str(n)], result["after"][str(n)]
            lines.append(f"{n:<20}{b:>8.2f}{a:>12.2f}")
    else:
        b, a = (result[k][str(result["steps"][0])] for k in ("before_metrics", "after_metrics"))
        bc = f"{result.get('start', 'BC')} ({result.get('policy', 'flow')})"
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


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = result["algo_title"]
    hist = result["history"]
    force = bool(hist) and "peak_force" in hist[0]
    fig, axes = plt.subplots(1, 3 if force else 2, figsize=(13.5 if force else 9, 3.4))
    steps = result["steps"]
    x = range(len(steps))
    for off, key, label in ((-0.2, "before", "BC"), (0.2, "after", f"after {name}")):
        axes[0].bar([i + off for i in x], [result[key][str(n)] for n in steps], 0.4, label=label)
    if len(result["steps"]) > 1:  # a kind that integrates: by steps
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
