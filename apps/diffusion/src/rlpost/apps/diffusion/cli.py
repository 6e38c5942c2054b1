"""``rlpost-diffusion``: RL post-training of flow-matching image generators.

rlpost-diffusion demo                         # RAM vs Flow-GRPO on the embedded digits model
rlpost-diffusion train --config ram_digits algo.params.m=10 train.steps=50
rlpost-diffusion train --config my.yaml --resume   # continue run.dir exactly
rlpost-diffusion export --config flow_grpo_sd3 model.path=... --checkpoint runs/x/checkpoints/step-000050 --out lora
rlpost-diffusion eval --config ram_digits --checkpoint runs/ram_digits/checkpoints/step-000150
rlpost-diffusion build-base                   # (re)build the digits model and reward classifier
rlpost-diffusion recipes | methods | doctor
"""

from __future__ import annotations

import argparse
import sys

import rlpost.diffusion as domain
from rlpost.apps.common import App

# (torch and the config's registries are imported by the command that needs them, not by
# ``--help``)


def _config(args: argparse.Namespace):
    from rlpost.diffusion.config import load_config
    from rlpost.diffusion.recipes import recipe_path

    return load_config(recipe_path(args.config) if args.config else None, args.overrides)


def _schema():
    from rlpost.diffusion.config import Config

    return Config


def _train(args: argparse.Namespace) -> int:
    from rlpost.diffusion.runlog import summary_table
    from rlpost.diffusion.trainer import Trainer

    cfg = _config(args)
    rows = Trainer(cfg).train(resume=args.resume, overwrite=args.overwrite)
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


def _export(args: argparse.Namespace) -> int:
    from rlpost.diffusion.export import WEIGHTS, export_checkpoint

    out = export_checkpoint(_config(args), args.checkpoint, args.out)
    print(f"exported {args.checkpoint} -> {out / WEIGHTS} (pipe.load_lora_weights({str(out)!r}))")
    return 0


def _reward_server(args: argparse.Namespace) -> int:
    from rlpost.diffusion.reward_server import serve_reward
    from rlpost.diffusion.rewards import load_reward

    try:
        httpd = serve_reward(load_reward(args.reward), args.host, args.port)
    except (OSError, OverflowError) as exc:
        raise ValueError(f"reward-server: cannot listen on {args.host}:{args.port}: {exc}") from exc
    host, port = httpd.server_address[:2]
    print(f"serving reward {args.reward!r} on http://{host}:{port}/ (flow_grpo's protocol); "
          f"train with reward.name=http://{host}:{port}/ ; Ctrl-C stops", flush=True)  # fmt: skip
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


def _build_base(args: argparse.Namespace) -> int:
    from rlpost.diffusion.models.digits import build_digits_base, build_digits_classifier

    print(build_digits_classifier(force=args.force))
    print(build_digits_base(force=args.force))
    return 0


def _recipes(_: argparse.Namespace) -> int:
    from rlpost.diffusion.recipes import recipe_names, recipe_path

    for name in recipe_names():
        first = recipe_path(name).read_text().splitlines()[0].lstrip("# ")
        print(f"{name:<20} {first}")
    return 0


def _methods(_: argparse.Namespace) -> int:
    from rlpost.diffusion.methods import METHODS

    print(METHODS.table())
    return 0


def build_app() -> App:
    app = App("rlpost-diffusion", __doc__, domain.__version__, domain.environment_report)
    app.command(
        "train", _train, "train with a recipe", config="ram_digits", run=True,
        schema=(_schema, _config),
    )  # fmt: skip
    d = app.command("demo", _demo, "RAM vs Flow-GRPO on the embedded digits model")
    d.add_argument("--out", default="runs/diffusion-demo")
    d.add_argument(
        "--steps", type=int, default=None, help="steps per method (default: the recipes' 150)"
    )
    d.add_argument("--reward", default=None, help="geneval (default), pickscore or hackable")
    d.add_argument("overrides", nargs="*", help="overrides applied to both runs")
    e = app.command("eval", _eval, "ODE eval of the base or a checkpoint", config="ram_digits")
    e.add_argument("--checkpoint", default=None, help="a checkpoints/step-XXXXXX folder")
    e.add_argument("--grid", default=None, help="write a PNG grid of the eval samples here")
    x = app.command(
        "export", _export, "a checkpoint's SD3 LoRA in diffusers' format (load_lora_weights)",
        config="flow_grpo_sd3",
    )  # fmt: skip
    x.add_argument("--checkpoint", required=True, help="a checkpoints/step-XXXXXX folder")
    x.add_argument("--out", required=True, help="the folder to write")
    r = app.command(
        "reward-server", _reward_server, "serve a reward over HTTP (flow_grpo's protocol)"
    )
    r.add_argument("--reward", default="geneval", help="a built-in reward or file.py:function")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=18085, help="0: any free port")
    b = app.command("build-base", _build_base, "build (or find) the digits model and classifier")
    b.add_argument("--force", action="store_true")
    app.command("recipes", _recipes, "list the shipped recipes")
    app.command("methods", _methods, "list the registered methods")
    return app


def main(argv: list[str] | None = None) -> int:
    return build_app().main(argv)


if __name__ == "__main__":
    sys.exit(main())
