"""``rlpost-robot``: RL post-training of robot policies on MuJoCo.

rlpost-robot demo                              # OTQL fine-tunes a BC flow policy (multimodal_reach)
rlpost-robot demo --task reacher --episodes 60
rlpost-robot train --config otql_reacher algo.params.episodes=40 run.dir=runs/x
rlpost-robot train --config otql_reacher run.dir=runs/x --resume   # continue it exactly
rlpost-robot train --config otql_reacher run.dir=runs/x --overwrite   # replace it
rlpost-robot train --config pac_act_contour        # PAC-ACT on lerobot ACT, force safety
rlpost-robot train --config craft_multimodal_reach # CRAFT closed-loop policy gradient
rlpost-robot residual --config decoding         # offline residual RL corrector (004-03)
rlpost-robot deploy --config contour            # a policy drives a lerobot Robot (simulated)
rlpost-robot deploy --config contour policy.run=runs/pac_act_contour
rlpost-robot eval runs/x --episodes 100          # a train run's policy on its task
rlpost-robot record --config contour_gantry run.dir=my_data   # demos as a LeRobotDataset
rlpost-robot train --config pac_act_contour data.path=my_data/dataset "data.rename={...}"
rlpost-robot fleet --robots 4 --minutes 5     # LWD: a fleet of robots on Ray, one learner
rlpost-robot fleet --robots 8 --minutes 10 run.dir=runs/f8 --resume   # continue it
rlpost-robot fleet --config otql_multimodal_reach  # the fleet with OTQL as its learner
rlpost-robot control --config pair_grpo_half_cheetah preset=grpo   # Pair-GRPO vs GRPO (001-14b)
rlpost-robot recipes | algorithms              # shipped recipes, registered algorithms
rlpost-robot build-base --task contour --kind act  # (re)build a demo set + BC policy in the cache
rlpost-robot tasks | doctor
"""

from __future__ import annotations

import argparse
import sys

import rlpost.robot as domain
from rlpost.apps.common import App


def _demo(args: argparse.Namespace) -> int:
    from rlpost.robot.demo import run_demo
    from rlpost.robot.train import format_table

    print(f"rlpost-robot demo: OTQL on {args.task}, {args.episodes} online episodes -> {args.out}")
    result = run_demo(
        args.out,
        task=args.task,
        episodes=args.episodes,
        eval_episodes=args.eval_episodes,
        bc_steps=args.bc_steps,
    )
    print(format_table(result))
    print(f"plot: {args.out}/success.png")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rlpost.robot.config import load_config, recipe_path
    from rlpost.robot.train import format_table, train_from_config

    cfg = load_config(recipe_path(args.config), args.overrides)
    result = train_from_config(cfg, resume=args.resume, overwrite=args.overwrite)
    print(format_table(result))
    print(f"run: {cfg.run.dir} (metrics.jsonl, success.png, policy/)")
    lerobot_copy = result.get("lerobot_policy", "none")
    if not lerobot_copy.startswith("none"):
        print(f"lerobot policy: {cfg.run.dir}/policy/lerobot")
    exp = result.get("experience")
    if exp is not None:
        where = exp["path"] or exp["note"]
        print(f"experience: {exp['episodes']} online episodes as a LeRobotDataset: {where}")
    return 0


def _train_config(args: argparse.Namespace):
    from rlpost.robot.config import load_config, recipe_path

    return load_config(recipe_path(args.config) if args.config else None, args.overrides)


def _train_schema():
    from rlpost.robot.config import Config

    return Config


def _job_schema(name: str) -> tuple:
    """(the job's config class, ``args`` -> its loaded config)."""

    def model():
        from rlpost.robot.config import JOBS

        return JOBS[name]

    def load(args: argparse.Namespace):
        from rlpost.robot.config import load_job, recipe_path

        path = recipe_path(args.config, name) if args.config else None
        return load_job(name, path, args.overrides)

    return model, load


def _job(args: argparse.Namespace) -> int:
    from rlpost.robot import jobs
    from rlpost.robot.config import load_job, recipe_path

    job = load_job(args.command, recipe_path(args.config, args.command), args.overrides)
    from rlpost.robot import control

    run = {
        "residual": jobs.run_residual,
        "deploy": jobs.run_deploy,
        "record": jobs.run_record,
        "control": control.run_control,
    }
    fmt = {
        "residual": jobs.format_residual,
        "deploy": jobs.format_deploy,
        "record": jobs.format_record,
        "control": control.format_control,
    }
    print(fmt[args.command](run[args.command](job, overwrite=args.overwrite)))
    print(f"run: {job.run.dir}")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from rlpost.robot.config import load_job, recipe_path
    from rlpost.robot.fleet.job import format_fleet, run_fleet

    overrides = list(args.overrides)
    if args.robots is not None:
        overrides.append(f"fleet.robots={args.robots}")
    if args.minutes is not None:
        overrides.append(f"fleet.minutes={args.minutes}")
    job = load_job("fleet", recipe_path(args.config, "fleet"), overrides)
    print(format_fleet(run_fleet(job, resume=args.resume, overwrite=args.overwrite)))
    print(f"run: {job.run.dir} (fleet.png, metrics.jsonl, store/current, policy/)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlpost.robot import jobs

    result = jobs.evaluate_run(args.run, args.episodes, args.seed, args.steps)
    print(jobs.format_eval(result))
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 0


def _recipes(_: argparse.Namespace) -> int:
    from rlpost.robot.config import load_job, recipes_dir

    for path in sorted(recipes_dir("train").glob("*.yaml")):
        cfg = load_job("train", path)
        print(f"train     {path.stem:<24} {cfg.algo.name:<8} {cfg.policy.kind:<9} {cfg.task}")
    for path in sorted(recipes_dir("residual").glob("*.yaml")):
        print(f"residual  {path.stem:<24} (synthetic base decoder)")
    for path in sorted(recipes_dir("deploy").glob("*.yaml")):
        job = load_job("deploy", path)
        print(f"deploy    {path.stem:<24} {job.robot.type:<13} {job.policy.kind:<9} {job.task}")
    for path in sorted(recipes_dir("record").glob("*.yaml")):
        job = load_job("record", path)
        print(f"record    {path.stem:<24} {job.robot_type:<13} {'':<9} {job.task}")
    for path in sorted(recipes_dir("control").glob("*.yaml")):
        job = load_job("control", path)
        print(f"control   {path.stem:<24} {job.preset:<13} {'gaussian':<9} {job.env_id}")
    for path in sorted(recipes_dir("fleet").glob("*.yaml")):
        job = load_job("fleet", path)
        print(f"fleet     {path.stem:<24} {job.learner.algo:<13} {job.fleet.robots:<9} {job.task}")
    return 0


def _algorithms(_: argparse.Namespace) -> int:
    from rlpost.robot.algos import ALGORITHMS

    for name in ALGORITHMS.names():
        a = ALGORITHMS.get(name)
        fleet = "fleet" if a.fleet is not None else ""
        print(f"{name:<10} {a.title:<8} policy.kind={a.policy_kind:<9} {fleet:<6} {a.paper}")
    return 0


def _build_base(args: argparse.Namespace) -> int:
    from rlpost.robot.config import DemoConfig, PolicyConfig
    from rlpost.robot.envs import TASKS
    from rlpost.robot.policies.kinds import POLICY_KINDS
    from rlpost.robot.pretrain import build_demo_dataset

    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; tasks: {sorted(TASKS)}")
    if args.kind not in POLICY_KINDS:
        raise ValueError(
            f"--kind: unknown policy kind {args.kind!r}; kinds: {sorted(POLICY_KINDS)}"
        )
    demos = DemoConfig().model_dump()
    print(build_demo_dataset(args.task, force=args.force, **demos))
    policy = PolicyConfig(kind=args.kind)
    print(policy.build(args.task, demos, True, force=args.force))
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from rlpost.robot.envs import TASKS
    from rlpost.robot.features import FeatureMap

    if args.episodes:
        return _task_experts(args.episodes)
    for name, spec in TASKS.items():
        print(f"{name:<24} obs {spec.obs_dim:>4}  act {spec.act_dim}  steps {spec.max_steps:>3}")
        if args.names:
            f = FeatureMap.for_task(name)
            cam = f"  camera {f.image[0]} {f.image[1]}" if f.image else ""
            print(f"  observation: {', '.join(f.observation)}{cam}")
            print(f"  action:      {', '.join(f.action)}")
    return 0


def _task_experts(n: int) -> int:
    """Success of the scripted demonstrators and of random actions (and peak forces)."""
    from rlpost.robot.demos import scripted_success
    from rlpost.robot.envs import TASKS

    print(f"{'task':<24} {'good':>5} {'poor':>5} {'random':>6}   peak force good / poor")
    for name in TASKS:
        r = scripted_success(name, n, seed=1000)
        force = "".join(
            f"{'   ' if q == 'good' else ' / '}{r[q]['peak_force']:.1f} N "
            f"({r[q]['above_8n']:.0%} of steps > 8 N)"
            for q in ("good", "poor")
            if "peak_force" in r[q]
        )
        rates = (
            f"{r['good']['success']:5.2f} {r['poor']['success']:5.2f} {r['random']['success']:6.2f}"
        )
        print(f"{name:<24} {rates}{force}", flush=True)
    print(f"{n} episodes each (seeds from 1000); success = the task's own threshold")
    return 0


def build_app() -> App:
    app = App("rlpost-robot", __doc__, domain.__version__, domain.environment_report)
    d = app.command("demo", _demo, "OTQL on a BC flow policy; success before/after, vs steps")
    d.add_argument("--out", default="runs/robot-demo")
    d.add_argument("--task", default="multimodal_reach")
    d.add_argument("--episodes", type=int, default=60, help="online episode budget")
    d.add_argument("--eval-episodes", type=int, default=100)
    d.add_argument("--bc-steps", type=int, default=None, help="BC steps (default: the recipe's)")
    app.command(
        "train",
        _train,
        "run a recipe (any registered algorithm) with key=value overrides",
        config="otql_reacher",
        config_required=True,
        run=True,
        schema=(_train_schema, _train_config),
    )
    for name, help_, example in (
        (
            "residual",
            "train the offline residual RL corrector of a base decoder (004-03)",
            "decoding",
        ),
        ("deploy", "run a policy on a robot through lerobot's Robot interface", "contour"),
        ("record", "record scripted demonstrations as a LeRobotDataset", "contour_gantry"),
        (
            "control",
            "a GRPO-family preset on a gymnasium MuJoCo task from scratch (Pair-GRPO, 001-14b)",
            "pair_grpo_half_cheetah",
        ),
    ):
        j = app.command(
            name, _job, help_, config=example, config_required=True, schema=_job_schema(name)
        )
        j.add_argument(
            "--overwrite", action="store_true", help="replace the run in run.dir (its metrics)"
        )
    f = app.command(
        "fleet",
        _fleet,
        "LWD (or OTQL): a fleet of simulated robots on Ray, one learner, a crash-safe store",
        config="lwd_multimodal_reach",
        run=True,
        schema=_job_schema("fleet"),
    )
    f.add_argument("--robots", type=int, default=None, help="robots in the fleet (fleet.robots)")
    f.add_argument("--minutes", type=float, default=None, help="wall-clock budget (fleet.minutes)")
    f.set_defaults(config="lwd_multimodal_reach")
    e = app.command("eval", _eval, "evaluate a train run's policy on its simulated task")
    e.add_argument("run", help="a rlpost-robot train run directory")
    e.add_argument("--episodes", type=int, default=100)
    e.add_argument("--seed", type=int, default=10_000, help="first episode seed")
    e.add_argument("--steps", type=int, default=None, help="integration steps (flow policies)")
    e.add_argument("--out", default=None, help="also write the result as JSON here")
    app.command("recipes", _recipes, "list the shipped recipes")
    app.command("algorithms", _algorithms, "list the registered algorithms")
    b = app.command("build-base", _build_base, "build (or find) the demo set and BC policy")
    b.add_argument("--task", default="multimodal_reach")
    b.add_argument("--kind", default="flow", help="a policy kind (flow, act, ...)")
    b.add_argument("--force", action="store_true")
    t = app.command("tasks", _tasks, "list the tasks")
    t.add_argument("--names", action="store_true", help="their feature names (data.rename)")
    t.add_argument(
        "--episodes",
        type=int,
        default=0,
        help="measure the scripted good / poor demonstrators and random actions over N episodes",
    )
    return app


def main(argv: list[str] | None = None) -> int:
    return build_app().main(argv)


if __name__ == "__main__":
    sys.exit(main())
