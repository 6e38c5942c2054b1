"""Staleness x learning-rate calibration (catalog 004-24) on CPU: a coarse sweep of the
synchronization interval S and a constant learning rate eta with GRPO, then the fit of
the stability boundary (S * eta) and the collapse budget (eta * t_collapse).

S is the trainer's staged generation (``algo.stages``, Mu-GRPO's mechanism): the rollouts
of S consecutive updates are generated at once with the weights at the start of the
stage, so update j of a stage trains on rollouts j versions stale, and the rollout
weights are refreshed every S updates. S = 1 is synchronous GRPO.

A run has collapsed at the first step where the training accuracy, averaged over a
window of 5 steps, falls below ``--collapse-frac`` (default 0.5) of its first window's
value, or an update was skipped as non-finite. The fit
(:mod:`rlpost.core.calibration`) brackets each S's threshold between its largest stable
and smallest collapsing eta, fits ``eta* = c * S^-b`` (the paper: b about 1), takes the
median ``eta * t`` of the collapsed runs, and recommends an eta for each S and the
horizon. Prints the grid and the fit, writes the common JSON shape and a PNG of the
stable / collapsed grid with the fitted boundary.

    uv run --frozen python tools/calibrate_staleness.py            # about 5 min
    uv run --frozen python tools/calibrate_staleness.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import print_table, run_pool, write_result

WINDOW = 5


def job(spec: dict) -> dict[str, Any]:
    import torch

    from rlpost.core.guard import RunStopped
    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    s, lr, steps = spec["interval"], spec["lr"], spec["steps"]
    run_dir = Path(spec["root"]) / f"s{s}-lr{lr:g}"
    cfg = load_config(
        recipe_path("grpo_arithmetic"),
        [
            f"algo.stages={steps // s}", f"optim.lr={lr}", "optim.grad_clip=null",
            f"rollout.prompts_per_step={spec['prompts']}", "rollout.group_size=8",
            f"train.steps={steps}", "run.eval_every=0", "run.save_every=0",
            f"run.seed={spec['seed']}", "run.threads=1", "run.progress=false",
            "run.tensorboard=false", "reward.workers=0", f"run.dir={run_dir}",
        ],
    )  # fmt: skip
    t0 = time.perf_counter()
    stopped = False
    try:
        Trainer(cfg).train()
    except RunStopped:  # bad steps in a row: the run diverged
        stopped = True
    rows = [r for r in read_metrics(run_dir) if "accuracy" in r]
    acc = [r["accuracy"] for r in rows]
    first = sum(acc[:WINDOW]) / WINDOW
    collapse = None
    for t in range(WINDOW, len(acc) + 1):
        if sum(acc[t - WINDOW : t]) / WINDOW < spec["collapse_frac"] * first:
            collapse = rows[t - 1]["step"]
            break
    skipped = next((r["step"] for r in rows if r.get("skipped_steps", 0) > 0), None)
    if skipped is not None and (collapse is None or skipped < collapse):
        collapse = skipped
    if stopped and collapse is None:
        collapse = rows[-1]["step"] + 1 if rows else 1
    return {
        "interval": s, "lr": lr, "collapsed": collapse is not None, "collapse_step": collapse,
        "acc_first": first, "acc_last": sum(acc[-WINDOW:]) / WINDOW,
        "max_staleness": max(r["staleness"] for r in rows), "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def plot(runs: list[dict], boundary, path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ss = sorted({r["interval"] for r in runs})
    for collapsed, mark, label in ((False, "o", "stable"), (True, "x", "collapsed")):
        pts = [(r["interval"], r["lr"]) for r in runs if r["collapsed"] == collapsed]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=mark, s=60, label=label)
    if boundary is not None:
        ax.plot(ss, [boundary.threshold(s) for s in ss], "k--",
                label=f"fit: eta* = {boundary.c:.2g} S^{-boundary.exponent:+.2f}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(ss, [str(s) for s in ss])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set(yscale="log", xlabel="synchronization interval S",
           ylabel="learning rate", title="GRPO stability, tiny model, 2-digit addition")  # fmt: skip
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    from rlpost.core.calibration import SweepRun, collapse_budget, recommend, stability_boundary

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--collapse-frac", type=float, default=0.5)
    ap.add_argument("--horizon", type=int, default=200, help="updates the recommendation is for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="bench_results/llm_staleness_calibration.json")
    ap.add_argument("--plot", default="docs/img/staleness_calibration.png")
    a = ap.parse_args()
    if a.quick:
        a.intervals, a.lrs, a.steps, a.prompts = [1, 2], [1e-4, 1e-2], 10, 4
        a.out, a.plot = "bench_results/llm_staleness_calibration_quick.json", "/tmp/stale.png"
    from rlpost.llm.model.tiny import build_base

    t0 = time.perf_counter()
    build_base("arithmetic", digits=2)  # cached: the grpo_arithmetic base
    with tempfile.TemporaryDirectory(prefix="calibrate_") as tmp:
        spec = {"root": tmp, "steps": a.steps, "prompts": a.prompts, "seed": a.seed,
                "collapse_frac": a.collapse_frac}  # fmt: skip
        jobs = [{**spec, "interval": s, "lr": lr} for s in a.intervals for lr in a.lrs]
        done = run_pool(
            job, jobs, 2,
            lambda r: f"S={r['interval']} lr={r['lr']:g}: "
            + (f"collapsed at step {r['collapse_step']}" if r["collapsed"] else "stable"),
        )  # fmt: skip
    done.sort(key=lambda r: (r["interval"], r["lr"]))
    print_table(done, ["interval", "lr", "collapsed", "collapse_step", "acc_first", "acc_last",
                       "max_staleness", "seconds"])  # fmt: skip
    runs = [SweepRun(r["interval"], r["lr"], r["collapsed"], r["collapse_step"]) for r in done]
    boundary = budget = None
    fit: dict[str, Any] = {}
    try:
        boundary = stability_boundary(runs)
        fit.update(c=boundary.c, exponent=boundary.exponent, thresholds=boundary.thresholds)
        print(f"stability boundary: eta* = {boundary.c:.3g} * S^{-boundary.exponent:+.2f}; "
              f"S * eta* per interval: {[f'{p:.2g}' for p in boundary.products()]}")  # fmt: skip
    except ValueError as exc:
        print(f"no boundary: {exc}")
    try:
        budget = collapse_budget(runs)
        fit.update(budget=budget.median, budget_spread=budget.spread,
                   budget_per_interval=budget.per_interval)  # fmt: skip
        print(f"collapse budget: eta * t = {budget.median:.3g} (max/min {budget.spread:.2f}; "
              f"per S {({s: round(v, 4) for s, v in budget.per_interval.items()})})")  # fmt: skip
    except ValueError as exc:
        print(f"no budget: {exc}")
    if boundary is not None:
        rec = {s: recommend(boundary, budget, s, a.horizon, a.lrs) for s in a.intervals}
        fit["recommended"] = rec
        print(f"recommended eta for {a.horizon} updates: {rec}")
    plot(done, boundary, a.plot)
    write_result(
        a.out,
        name="llm_staleness_calibration",
        catalog_ids=["004-24"],
        config={**vars(a), "fit": fit},  # (the fitted law beside the sweep's settings)
        seeds=[a.seed],
        rows=done,
        headline={
            "metric": "fitted exponent b of the stability boundary eta* = c S^-b",
            "value": fit.get("exponent"),
            "baseline": 1.0,
            "ratio": fit.get("exponent"),
            "paper": "the largest stable learning rate scales about as 1/S (constant S*eta); "
            "collapse time scales about as 1/eta (a cumulative learning-rate budget) (004-24)",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
