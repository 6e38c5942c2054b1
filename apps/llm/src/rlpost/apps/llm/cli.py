"""``rlpost-llm``: RL post-training of language models from the command line.

rlpost-llm demo                                 # tiny model, GRPO on 2-digit addition
rlpost-llm train --config grpo_arithmetic optim.lr=1e-4 train.steps=100
rlpost-llm train --config my.yaml --resume      # continue the run in run.dir exactly
rlpost-llm train --config my.yaml --overwrite   # replace the run in run.dir
rlpost-llm eval --config grpo_arithmetic --checkpoint runs/x/checkpoints/step-000060
rlpost-llm export --config my.yaml --checkpoint runs/x/checkpoints/step-000060 --out hf-model
rlpost-llm dpo --config dpo_arithmetic loss.name=simpo [--resume]   # preference training
rlpost-llm dlr --config dlr_arithmetic latent.codes=0   # DLR's latent codes (0 codes: SFT)
rlpost-llm train --config copd_mixture          # CoPD: experts as Ray actors, then one model
rlpost-llm train --config federated_arithmetic  # clients' compressed, asynchronous updates
rlpost-llm train --config mutual_arithmetic     # Mutual RL: two tokenizers share experience
rlpost-llm train --config step_opsd_household   # multi-turn agents (also grpo_search, ...)
rlpost-llm monitor --config grpo_arithmetic --context "training=0:{prompt}" [--noise 0.005,0.01]
rlpost-llm exploits --config grpo_search "data.env.params.shortcuts=[metadata, tamper]"
rlpost-llm traces runs/x --step 20                # a step's best and worst groups (run.traces=true)
rlpost-llm flops runs/a runs/b                    # FLOPs split: rollout, update, feedback
rlpost-llm relex runs/x --upto 30 --to 100 200 --out relex --eval   # RELEX's extrapolated checkpoints
rlpost-llm sar runs/a runs/b --rank 8 --out merged --eval   # SAR: spectral cores, merged experts
rlpost-llm pust runs/proxy --to runs/primary --alpha 1 --out pust   # PUST: a proxy's update, transferred
rlpost-llm layers --config grpo_arithmetic train.steps=100 --out layers   # each layer's share of RL's gain
rlpost-llm retention runs/a runs/b --probe arithmetic "arithmetic:{digits: 1}"   # behaviour kept across runs
rlpost-llm value-gradient base-300 base-600 runs/x --samples 8   # RL's signal x headroom per model
rlpost-llm features --base BASE runs/rl runs/sft --probe arithmetic countdown   # RL vs SFT, feature level
rlpost-llm reward-model --out runs/rm             # variance-aware reward model (mean, spread)
rlpost-llm build-base --task arithmetic         # (re)build the embedded default model
rlpost-llm presets | doctor
"""

from __future__ import annotations

import argparse
import os
import sys

import rlpost.llm as llm
from rlpost.apps.common import App

# (torch, transformers and the config's registries are imported by the command that needs
# them, not by ``--help``)


def _config(args: argparse.Namespace):
    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path

    path = recipe_path(args.config) if args.config else None
    return load_config(path, args.overrides)


def _train_schema():
    from rlpost.llm.config import Config

    return Config


def _say(report: str) -> None:
    if report:
        print(report)


def _train(args: argparse.Namespace) -> int:
    """The runtime the config selects: the GRPO-family trainer, or CoPD's experts, Mutual
    RL's policies or federated clients on Ray."""
    from rlpost.llm.runtimes.base import runtime_for

    cfg = _config(args)
    _say(runtime_for(cfg).run(cfg, resume=args.resume, overwrite=args.overwrite))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.runtimes.base import RUNTIMES

    overrides = [f"run.dir={args.out}", *args.overrides]
    if args.steps:
        overrides.append(f"train.steps={args.steps}")
    cfg = load_config(recipe_path("grpo_arithmetic"), overrides)
    print(
        f"rlpost-llm demo: {cfg.algo.preset} on {cfg.data.task}, {cfg.train.steps} steps -> {cfg.run.dir}"
    )
    _say(RUNTIMES.get("grpo").run(cfg, overwrite=True))  # the demo replaces its own output
    return 0


def _own_config_runtime(name: str, args: argparse.Namespace) -> int:
    """A runtime with a config of its own (``dpo``: the preference trainer; ``dlr``)."""
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.runtimes.base import RUNTIMES

    rt = RUNTIMES.get(name)
    cfg = rt.load(recipe_path(args.config) if args.config else None, args.overrides)
    _say(rt.run(cfg, resume=args.resume, overwrite=args.overwrite))
    return 0


def _own_config(name: str) -> tuple:
    """(the model class, ``args`` -> the loaded config) of a runtime with its own config."""

    def load(args: argparse.Namespace):
        from rlpost.llm.recipes import recipe_path
        from rlpost.llm.runtimes.base import RUNTIMES

        return RUNTIMES.get(name).load(recipe_path(args.config) if args.config else None,
                                       args.overrides)  # fmt: skip

    return (lambda: type(load(argparse.Namespace(config=None, overrides=[]))), load)


def _dpo(args: argparse.Namespace) -> int:
    return _own_config_runtime("preference", args)


def _dlr(args: argparse.Namespace) -> int:
    return _own_config_runtime("dlr", args)


def _eval(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.evaluate import evaluate_config

    res = evaluate_config(_config(args), args.checkpoint, samples=args.samples)
    for k, v in res.items():
        print(f"{k:<24} {v:.4f}" if isinstance(v, float) else f"{k:<24} {v}")
    return 0


def _show(report, out: str | None) -> int:
    """Print a hacking report's table; with ``out``, also write it as JSON."""
    print(report.table())
    if out:
        import json
        from pathlib import Path

        Path(out).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 0


def _monitor(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.evaluate import monitor_config

    contexts = {"plain": "{prompt}"}
    for c in args.context:
        name, sep, template = c.partition("=")
        if not sep or not name:
            raise ValueError(f"--context wants name=template, got {c!r}")
        contexts[name] = template
    noise = None
    if args.noise:
        try:
            noise = [float(x) for x in args.noise.split(",")]
        except ValueError:
            raise ValueError(f"--noise wants comma-separated sigmas, got {args.noise!r}") from None
    report = monitor_config(
        _config(args), contexts, args.samples, args.checkpoint, noise, args.noise_seeds
    )
    return _show(report, args.out)


def _exploits(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.evaluate import exploits_config

    report = exploits_config(_config(args), args.checkpoint, args.greedy)
    return _show(report, args.out)


def _export(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.evaluate import export_checkpoint

    out = export_checkpoint(_config(args), args.checkpoint, args.out)
    print(
        f"exported {args.checkpoint} -> {out} (AutoModelForCausalLM.from_pretrained({str(out)!r}))"
    )
    return 0


def _traces(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.traces import show_step

    print(show_step(args.run, args.step, args.groups))
    return 0


def _reward_model(args: argparse.Namespace) -> int:
    from rlpost.llm.preference.variance_rm import fit_reward_model

    r = fit_reward_model(args.out, args.data, args.model, steps=args.steps, lr=args.lr,
                         seed=args.seed)  # fmt: skip
    print(f"reward model: {r['pairs']} pairs ({r['data']}), {r['steps']} steps, loss "
          f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}")  # fmt: skip
    print(f"held out ({r['held_out']} pairs): pair accuracy {r['pair_accuracy']:.3f}"
          + (f", anchor calibration error {r['anchor_abs_error']:.3f}"
             if "anchor_abs_error" in r else ""))  # fmt: skip
    print(
        f"saved: {args.out} (AutoModelForSequenceClassification; reward: "
        f"rlpost.llm.preference.variance_rm.VarianceReward({args.out!r}, kappa=...))"
    )
    return 0


def _flops(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.flops import report

    print(report(args.runs))
    return 0


def _relex(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.relex import evaluate_written, relex

    r = relex(args.run, args.upto, args.to, args.out)
    print(f"observed steps {r['observed_steps']}: the rank-1 directions hold "
          f"{r['energy']:.1%} of the deltas' energy")  # fmt: skip
    for step, folder in r["written"].items():
        print(f"step {step}: {folder}")
    if args.eval:
        print(evaluate_written(args.run, r))
    print(f"report: {args.out}/relex.json")
    return 0


def _sar(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.sar import evaluate_model, sar

    r = sar(args.experts, args.out, args.rank, args.energy, not args.drop_vectors, args.lam)
    for e in r["experts"]:
        print(f"{e['checkpoint']}: core {e['param_share']:.2%} of the parameters, "
              f"{e['norm_share']:.1%} of the update's squared norm")  # fmt: skip
    print(f"written: {r['written']} (sar.json)")
    if args.eval:
        print(evaluate_model(args.experts, r["written"]))
    return 0


def _pust(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.pust import pust

    r = pust(args.proxy, args.to, args.out, args.alpha)
    print(f"{r['tensors']} tensors moved by {args.alpha} x the proxy's update (norm "
          f"{r['update_norm']:.4g}): {r['written']} (pust.json)")  # fmt: skip
    return 0


def _layers(args: argparse.Namespace) -> int:
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.tools.layers import layer_contribution

    path = recipe_path(args.config) if args.config else None
    rows = layer_contribution(path, args.overrides, args.out)
    print("run        held-out before -> after   share of full RL's gain")
    for r in rows:
        share = r["share_of_full_gain"]
        print(f"{r['run']:<10} {r['heldout_before']:.3f} -> {r['heldout_after']:.3f}   "
              f"{'-' if share is None else f'{share:.2f}'}")  # fmt: skip
    print(f"table and plot: {args.out}/layers.json, {args.out}/layers.png")
    return 0


def _retention(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.retention import retention

    table = retention(args.runs, args.probe, args.out, args.size)
    cols = [c for p in table["probes"] for c in (p, f"{p} kl")]
    heads = [c[:22] if c in table["probes"] else f"KL {c[:-3]}"[:22] for c in cols]
    for run, rows in table["runs"].items():
        print(run)
        print("  step  drift  " + "  ".join(f"{h:>22}" for h in heads))
        for r in rows:
            vals = "  ".join(f"{r[c]:>22.3f}" for c in cols)
            print(f"  {r['step']:>4}  {r['param_drift']:.3f}  {vals}")
    print(f"table and plot: {args.out}/retention.json, {args.out}/retention.png")
    return 0


def _value_gradient(args: argparse.Namespace) -> int:
    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.tools.value_gradient import value_gradient

    cfg = load_config(recipe_path(args.config), args.set)
    rows = value_gradient(args.models, cfg, args.out, args.prompts, args.samples, args.seed)
    print(f"{'model':<24} {'mean':>6} {'reach':>6} {'headroom':>8} {'signal':>9} {'snr':>7} "
          f"{'criterion':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['model'][-24:]:<24} {r['mean_reward']:>6.3f} {r['reachable_reward']:>6.3f} "
              f"{r['headroom']:>8.3f} {r['signal']:>9.4f} {r['snr']:>7.3f} {r['criterion']:>9.4f}")  # fmt: skip
    print(f"table and plot: {args.out}/value_gradient.json, {args.out}/value_gradient.png")
    return 0


def _features(args: argparse.Namespace) -> int:
    from rlpost.llm.tools.features import feature_study

    r = feature_study(args.base, args.runs, args.probe, args.out, args.layer, args.features,
                      args.k, args.size, args.top, args.gamma, args.sae_steps)  # fmt: skip
    print(f"layer {r['layer']}, {r['features']} features (top-{r['k']}), unexplained variance "
          f"{r['unexplained_variance']:.3f}")  # fmt: skip
    for run, x in r["runs"].items():
        last = x["trajectory"][-1]
        print(f"{run}: at step {last['step']} {last['changed']} changed, {last['new']} new, "
              f"{last['lost']} lost of {last['live']} live; mean drift {last['mean_drift']:.3f}; "
              f"{x['wins']} wins over the base")  # fmt: skip
        print(f"  {'greedy accuracy':<28} " + "  ".join(f"{p[:22]:>22}" for p in r["probes"]))
        for name, acc in x["accuracy"].items():
            print(f"  {name:<28} " + "  ".join(f"{a:>22.3f}" for a in acc))
    print(f"report and plot: {args.out}/features.json, {args.out}/features.png")
    return 0


def _build_base(args: argparse.Namespace) -> int:
    from rlpost.llm.model.tiny import build_base

    print(build_base(args.task, force=args.force))
    return 0


def _presets(_: argparse.Namespace) -> int:
    from rlpost.llm.tools.presets import preset_table

    print(preset_table())
    return 0


def build_app() -> App:
    app = App("rlpost-llm", __doc__, llm.__version__, llm.environment_report)
    app.command(
        "train", _train, "train with a recipe", config="grpo_arithmetic", run=True,
        schema=(_train_schema, _config),
    )  # fmt: skip
    d = app.command("demo", _demo, "GRPO on the embedded tiny model; before/after accuracy")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--steps", type=int, default=None)
    d.add_argument("overrides", nargs="*")
    app.command(
        "dpo",
        _dpo,
        "preference training with any preference loss (loss.name=...)",
        config="dpo_arithmetic",
        run=True,
        schema=_own_config("preference"),
    )
    app.command(
        "dlr",
        _dlr,
        "Dynamic Latent Routing: discrete codes + router by search-select-update (0 codes: SFT)",
        config="dlr_arithmetic",
        run=True,
        schema=_own_config("dlr"),
    )
    e = app.command(
        "eval", _eval, "held-out accuracy of a policy / checkpoint", config="grpo_arithmetic"
    )
    e.add_argument("--checkpoint", default=None)
    e.add_argument("--samples", type=int, default=0, help="also pass@k with k sampled answers")
    m = app.command(
        "monitor",
        _monitor,
        "exploration-hacking monitor: pass rate and entropy across prompt contexts",
        config="grpo_arithmetic",
    )
    m.add_argument(
        "--context", action="append", default=[], metavar="NAME=TEMPLATE",
        help="a context to compare with the plain prompt, e.g. 'training=RL episode: {prompt}'",
    )  # fmt: skip
    m.add_argument("--samples", type=int, default=8, help="samples per problem (k)")
    m.add_argument("--checkpoint", default=None)
    m.add_argument(
        "--noise", default=None, metavar="SIGMAS",
        help="also the weight-noising probe at these noise scales, e.g. '0.002,0.005,0.01'",
    )  # fmt: skip
    m.add_argument("--noise-seeds", type=int, default=3, help="noise draws per sigma")
    m.add_argument("--out", default=None, help="write the report as JSON")
    xp = app.command(
        "exploits",
        _exploits,
        "exploit rates in an environment with planted shortcuts, and hardened",
        config="grpo_search",
    )
    xp.add_argument("--checkpoint", default=None)
    xp.add_argument("--greedy", action="store_true", help="greedy episodes (default: sampled)")
    xp.add_argument("--out", default=None, help="write the report as JSON")
    x = app.command(
        "export",
        _export,
        "a checkpoint as a standalone Hugging Face model (LoRA merged)",
        config="grpo_arithmetic",
    )
    x.add_argument("--checkpoint", required=True, help="a checkpoints/step-XXXXXX folder")
    x.add_argument("--out", required=True, help="the folder to write")
    tr = app.command("traces", _traces, "a step's best and worst groups (run.traces=true)")
    tr.add_argument("run", help="a run directory")
    tr.add_argument("--step", type=int, default=None, help="the step (default: the last)")
    tr.add_argument("--groups", type=int, default=2, help="how many best and worst groups")
    rm = app.command(
        "reward-model", _reward_model, "train a variance-aware reward model (mean and spread)"
    )
    rm.add_argument("--data", default=None, help="preference JSONL (default: embedded judges)")
    rm.add_argument("--model", default="tiny", help="tiny, or a causal LM's folder")
    rm.add_argument("--steps", type=int, default=300)
    rm.add_argument("--lr", type=float, default=1e-3)
    rm.add_argument("--seed", type=int, default=0)
    rm.add_argument("--out", default="runs/reward_model")
    fl = app.command("flops", _flops, "where runs' compute went: rollout, update, feedback")
    fl.add_argument("runs", nargs="+", help="run directories (several: RACE's pilot grid)")
    rx = app.command(
        "relex", _relex, "extrapolate a run's checkpoints along their rank-1 direction"
    )
    rx.add_argument("run", help="a run directory (its checkpoints up to --upto are observed)")
    rx.add_argument("--upto", type=int, required=True, help="the last step of the window")
    rx.add_argument("--to", type=int, nargs="+", required=True, help="steps to write")
    rx.add_argument("--out", default="relex", help="the folder for the written checkpoints")
    rx.add_argument("--eval", action="store_true", help="held-out accuracy of each (and of "
                    "the run's own checkpoint at that step, when kept)")  # fmt: skip
    sa = app.command("sar", _sar, "keep runs' updates in the base's spectral subspace; merge")
    sa.add_argument("experts", nargs="+", help="run directories (latest checkpoint) or checkpoints")
    grp = sa.add_mutually_exclusive_group(required=True)
    grp.add_argument("--rank", type=int, help="top singular directions kept per matrix")
    grp.add_argument("--energy", type=float, help="or: the fewest holding this energy share")
    sa.add_argument("--lam", type=float, nargs="+", default=None, help="experts' weights (1 each)")
    sa.add_argument("--drop-vectors", action="store_true", help="drop norm / bias updates too")
    sa.add_argument("--out", default="sar", help="the folder to write")
    sa.add_argument("--eval", action="store_true", help="held-out accuracy on each expert's task")
    pu = app.command("pust", _pust, "transfer a proxy run's improvement to a primary model")
    pu.add_argument("proxy", help="the proxy's run directory (latest checkpoint) or checkpoint")
    pu.add_argument("--to", required=True, help="the primary: a model folder, run or checkpoint")
    pu.add_argument("--alpha", type=float, default=1.0, help="the update's strength")
    pu.add_argument("--out", default="pust", help="the folder to write")
    ly = app.command("layers", _layers, "train each layer alone: its share of full RL's gain")
    ly.add_argument("--config", default=None, help="a recipe name or YAML (default: the demo)")
    ly.add_argument("overrides", nargs="*", help="key=value overrides (train.steps=...)")
    ly.add_argument("--out", default="runs/layers", help="a new folder for the runs and table")
    rt = app.command("retention", _retention, "probe behaviours across runs' checkpoints")
    rt.add_argument("runs", nargs="+", help="run directories (their kept checkpoints)")
    rt.add_argument("--probe", nargs="+", required=True,
                    help="probe tasks: arithmetic, or 'arithmetic:{digits: 1}'")  # fmt: skip
    rt.add_argument("--size", type=int, default=256, help="examples per probe")
    rt.add_argument("--out", default="retention", help="the folder for the table and plot")
    vg = app.command(
        "value-gradient", _value_gradient, "RL's value-gradient signal and headroom per model"
    )
    vg.add_argument("models", nargs="+", help="model folders, or runs (every kept checkpoint)")
    vg.add_argument("--config", default="grpo_arithmetic", help="the task and sampling")
    vg.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    vg.add_argument("--prompts", type=int, default=64, help="prompts measured")
    vg.add_argument("--samples", type=int, default=8, help="responses per prompt (k >= 2)")
    vg.add_argument("--seed", type=int, default=0)
    vg.add_argument("--out", default="value_gradient", help="the folder for the table and plot")
    fe = app.command("features", _features, "RL vs SFT in one sparse feature space, per layer")
    fe.add_argument("runs", nargs="+", help="runs tuned from the base (their checkpoints)")
    fe.add_argument("--base", required=True, help="the base model's folder")
    fe.add_argument("--probe", nargs="+", default=["arithmetic"],
                    help="input tasks: arithmetic, or 'arithmetic:{digits: 1}'")  # fmt: skip
    fe.add_argument("--layer", type=int, default=None, help="decoder layer (default: middle)")
    fe.add_argument("--features", type=int, default=512, help="autoencoder features")
    fe.add_argument("--k", type=int, default=16, help="active features per token")
    fe.add_argument("--sae-steps", type=int, default=2000)
    fe.add_argument("--size", type=int, default=128, help="examples per probe")
    fe.add_argument("--top", type=int, default=8, help="mediating features to steer")
    fe.add_argument("--gamma", type=float, default=2.0, help="their amplification in the base")
    fe.add_argument("--out", default="features", help="the folder for the report and plot")
    b = app.command("build-base", _build_base, "build (or find) the embedded default model")
    b.add_argument("--task", default="arithmetic")
    b.add_argument("--force", action="store_true")
    app.command("presets", _presets, "list the GRPO-family presets")
    return app


def main(argv: list[str] | None = None) -> int:
    return build_app().main(argv)


def console() -> None:
    """The ``rlpost-llm`` command (and ``python -m rlpost.apps.llm.cli``): :func:`main`, and
    a torchrun rank's process ended without the interpreter's teardown (``end_rank``).
    Called in-process, :func:`main` returns as usual."""
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from rlpost.llm.train.parallel import end_rank

        end_rank(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
