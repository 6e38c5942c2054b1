"""``rlpost-diffusion``: RL post-training of flow-matching image generators.

rlpost-diffusion demo                         # RAM vs Flow-GRPO on the embedded digits model
rlpost-diffusion train --config ram_digits algo.params.m=10 train.steps=50
rlpost-diffusion train --config my.yaml --resume   # continue run.dir exactly
rlpost-diffusion eval --config ram_digits --checkpoint runs/ram_digits/checkpoints/step-000150
rlpost-diffusion build-base                   # (re)build the digits model and reward classifier
rlpost-diffusion recipes | doctor
"""

from __future__ import annotations

import argparse
import sys

import rlpost.diffusion as domain
from rlpost.diffusion.config import ConfigError, load_config
from rlpost.diffusion.recipes import recipe_names, recipe_path


def _config(args: argparse.Namespace):
    return load_config(recipe_path(args.config) if args.config else None, args.overrides)


def _train(args: argparse.Namespace) -> int:
    from rlpost.diffusion.runlog import summary_table
    from rlpost.diffusion.trainer import Trainer

    cfg = _config(args)
    rows = Trainer(cfg).train(resume=args.resume)
    print(summary_table(rows))
    print(f"run: {cfg.run.dir} (curves.png, samples_before.png, samples_after.png)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rlpost.diffusion.demo import format_table, run_demo

    print(f"rlpost-diffusion demo: RAM vs Flow-GRPO on the digits model -> {args.out}")
    result = run_demo(
        args.out, steps=args.steps, reward=args.reward, extra_overrides=args.overrides
    )
    print(format_table(result))
    print(f"images: {args.out}/samples.png (before | after), reward_curves.png")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rlpost.diffusion.trainer import evaluate_checkpoint

    for k, v in evaluate_checkpoint(_config(args), args.checkpoint, args.grid).items():
        print(f"{k:<22} {v:.4f}")
    return 0


def _build_base(args: argparse.Namespace) -> int:
    from rlpost.diffusion.models.digits import build_digits_base, build_digits_classifier

    print(build_digits_classifier(force=args.force))
    print(build_digits_base(force=args.force))
    return 0


def _recipes(_: argparse.Namespace) -> int:
    for name in recipe_names():
        first = recipe_path(name).read_text().splitlines()[0].lstrip("# ")
        print(f"{name:<20} {first}")
    return 0


def _doctor(_: argparse.Namespace) -> int:
    for name, version in domain.environment_report().items():
        print(f"{name:<14} {version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlpost-diffusion",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"rlpost-diffusion {domain.__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--config", help="YAML path or shipped recipe name (e.g. ram_digits)")
        sp.add_argument("overrides", nargs="*", help="field overrides, e.g. optim.lr=3e-4")
        return sp

    t = with_config(sub.add_parser("train", help="train with a recipe"))
    t.add_argument("--resume", action="store_true", help="continue from run.dir's checkpoint")
    t.set_defaults(fn=_train)
    d = sub.add_parser("demo", help="RAM vs Flow-GRPO on the embedded digits model")
    d.add_argument("--out", default="runs/diffusion-demo")
    d.add_argument(
        "--steps", type=int, default=None, help="steps per method (default: the recipes' 150)"
    )
    d.add_argument("--reward", default=None, help="geneval (default), pickscore or hackable")
    d.add_argument("overrides", nargs="*", help="overrides applied to both runs")
    d.set_defaults(fn=_demo)
    e = with_config(sub.add_parser("eval", help="ODE eval of the base or a checkpoint"))
    e.add_argument("--checkpoint", default=None, help="a checkpoints/step-XXXXXX folder")
    e.add_argument("--grid", default=None, help="write a PNG grid of the eval samples here")
    e.set_defaults(fn=_eval)
    b = sub.add_parser("build-base", help="build (or find) the digits model and classifier")
    b.add_argument("--force", action="store_true")
    b.set_defaults(fn=_build_base)
    sub.add_parser("recipes", help="list the shipped recipes").set_defaults(fn=_recipes)
    sub.add_parser(
        "doctor", help="print the versions of the engines this domain uses"
    ).set_defaults(fn=_doctor)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"rlpost-diffusion: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
