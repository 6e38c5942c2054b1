"""``rlpost-robot``: RL post-training of robot policies on MuJoCo.

rlpost-robot demo                              # OTQL fine-tunes a BC flow policy (multimodal_reach)
rlpost-robot demo --task reacher --episodes 60
rlpost-robot train --config otql_reacher algo.params.episodes=40 run.dir=runs/x
rlpost-robot train --config pac_act_contour        # PAC-ACT on lerobot ACT, force safety
rlpost-robot train --config craft_multimodal_reach # CRAFT closed-loop policy gradient
rlpost-robot recipes | algorithms              # shipped recipes, registered algorithms
rlpost-robot build-base --task contour --kind act  # (re)build a demo set + BC policy in the cache
rlpost-robot tasks | doctor
"""

from __future__ import annotations

import argparse
import sys

import rlpost.robot as domain


def _demo(args: argparse.Namespace) -> int:
    from rlpost.robot.demo import format_table, run_demo

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
    from rlpost.robot.demo import format_table
    from rlpost.robot.train import train_from_config

    cfg = load_config(recipe_path(args.config), args.overrides)
    print(format_table(train_from_config(cfg)))
    print(f"run: {cfg.run.dir} (metrics.jsonl, success.png, policy/)")
    return 0


def _recipes(_: argparse.Namespace) -> int:
    from rlpost.robot.config import RECIPES_DIR, load_config

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        cfg = load_config(path)
        print(f"{path.stem:<26} {cfg.algo.name:<8} {cfg.policy.kind:<9} {cfg.task}")
    return 0


def _algorithms(_: argparse.Namespace) -> int:
    from rlpost.robot.algos import ALGORITHMS

    for name in ALGORITHMS.names():
        a = ALGORITHMS.get(name)
        print(f"{name:<10} {a.title:<8} policy.kind={a.policy_kind:<9} {a.paper}")
    return 0


def _build_base(args: argparse.Namespace) -> int:
    from rlpost.robot.config import DemoConfig, PolicyConfig
    from rlpost.robot.envs import TASKS
    from rlpost.robot.pretrain import POLICY_KINDS, build_demo_dataset

    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; tasks: {sorted(TASKS)}")
    demos = DemoConfig().model_dump()
    print(build_demo_dataset(args.task, force=args.force, **demos))
    policy = PolicyConfig(kind=args.kind)
    print(POLICY_KINDS[args.kind].build(args.task, demos, policy, True, force=args.force))
    return 0


def _tasks(_: argparse.Namespace) -> int:
    from rlpost.robot.envs import TASKS

    for name, spec in TASKS.items():
        print(f"{name:<18} obs {spec.obs_dim:>2}  act {spec.act_dim}  steps {spec.max_steps:>3}")
    return 0


def _doctor(_: argparse.Namespace) -> int:
    for name, version in domain.environment_report().items():
        print(f"{name:<14} {version}")
    return 0


def _policy_kinds() -> list[str]:
    from rlpost.robot.pretrain import POLICY_KINDS

    return sorted(POLICY_KINDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlpost-robot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rlpost-robot {domain.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="OTQL on a BC flow policy; success before/after, vs steps")
    d.add_argument("--out", default="runs/robot-demo")
    d.add_argument("--task", default="multimodal_reach")
    d.add_argument("--episodes", type=int, default=60, help="online episode budget")
    d.add_argument("--eval-episodes", type=int, default=100)
    d.add_argument("--bc-steps", type=int, default=None, help="BC steps (default: the recipe's)")
    d.set_defaults(fn=_demo)
    t = sub.add_parser(
        "train", help="run a recipe (any registered algorithm) with key=value overrides"
    )
    t.add_argument("--config", required=True, help="YAML path or shipped recipe name")
    t.add_argument("overrides", nargs="*", help="e.g. algo.params.episodes=40 run.dir=runs/x")
    t.set_defaults(fn=_train)
    sub.add_parser("recipes", help="list the shipped recipes").set_defaults(fn=_recipes)
    sub.add_parser("algorithms", help="list the registered algorithms").set_defaults(fn=_algorithms)
    b = sub.add_parser("build-base", help="build (or find) the demo set and BC policy of a task")
    b.add_argument("--task", default="multimodal_reach")
    b.add_argument("--kind", choices=_policy_kinds(), default="flow")
    b.add_argument("--force", action="store_true")
    b.set_defaults(fn=_build_base)
    sub.add_parser("tasks", help="list the tasks").set_defaults(fn=_tasks)
    sub.add_parser(
        "doctor", help="print the versions of the engines this domain uses"
    ).set_defaults(fn=_doctor)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as exc:  # ConfigError is a ValueError
        print(f"rlpost-robot: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
