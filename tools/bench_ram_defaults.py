"""RAM's defaults on rewards they were not tuned on: reward gained against quality kept.

The RAM recipe was tuned on ``geneval``. On ``hackable`` (mean ink, maximised by a white
square) its defaults raise the reward fast and let the images stop being digits. This
benchmark trains RAM as shipped, RAM with the guards the package has (NormGuard, a
stronger pull to the reference: a lower ``m``, RAM's 1 / KL weight) and Flow-GRPO as
shipped, on all three digits rewards, and reports per run at the last step:

* reward gain: eval reward (fixed noise, 20-step ODE) minus the base model's;
* class accuracy: the classifier's recognition of the prompted digit, the quality a
  hacked reward lets fall (the base model's is about 0.83);
* the velocity-norm ratio ``||v_theta|| / ||v_ref||`` on the model's own trajectories.

    uv run --frozen python tools/bench_ram_defaults.py --seeds 0 1 --steps 150 --workers 2 \\
        --out docs/results/ram_defaults_2026-12-05.json

Each run is its own process with one torch thread (``bench_diffusion.run_job``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_diffusion import run_job
from benchlib import mean_std, print_table, run_pool, write_result

REWARDS = ["geneval", "pickscore", "hackable"]
NG = ["algo.normguard.coef=1.0", "algo.normguard.form=hinge"]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "flow_grpo": ("flow_grpo", []),
    "ram (m=30, no guard)": ("ram", ["algo.params.m=30.0", "algo.normguard.coef=0"]),
    "ram + normguard": ("ram", ["algo.params.m=30.0", *NG]),
    "ram m=10": ("ram", ["algo.params.m=10.0", "algo.normguard.coef=0"]),
    "ram m=10 + normguard": ("ram", ["algo.params.m=10.0", *NG]),
    "ram (recipe)": ("ram", []),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-per-prompt", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--work-dir", default="/tmp/rlpost-bench-ram-defaults")
    ap.add_argument("--out", default="docs/results/ram_defaults.json")
    args = ap.parse_args()

    from rlpost.diffusion.models.digits import build_digits_base, build_digits_classifier

    build_digits_classifier()
    build_digits_base()
    jobs = [
        dict(
            variant=v, method=VARIANTS[v][0], overrides=VARIANTS[v][1], reward=r, seed=s,
            steps=args.steps, eval_per_prompt=args.eval_per_prompt,
            dir=str(Path(args.work_dir) / f"{v.replace(' ', '_')}-{r}-s{s}"),
        )
        for v in args.variants for r in REWARDS for s in args.seeds
    ]  # fmt: skip
    for job in jobs:  # a fresh run each time (an earlier benchmark's runs are replaced)
        shutil.rmtree(job["dir"], ignore_errors=True)
    print(f"{len(jobs)} runs on {args.workers} workers ...", flush=True)
    t0 = time.perf_counter()
    results = run_pool(
        run_job, jobs, args.workers, lambda r: f"{Path(r['dir']).name:<44} {r['seconds']:5.0f} s"
    )
    rows: list[dict[str, Any]] = []
    for v in args.variants:
        for r in REWARDS:
            runs = [x for x in results if x["variant"] == v and x["reward"] == r]
            gain = [x["evals"][-1]["eval/reward"] - x["evals"][0]["eval/reward"] for x in runs]
            acc0 = [x["evals"][0]["eval/class_accuracy"] for x in runs]
            acc = [x["evals"][-1]["eval/class_accuracy"] for x in runs]
            ratio = [x["evals"][-1]["eval/vnorm_ratio"] for x in runs]
            rows.append({
                "variant": v, "reward": r, "steps": args.steps, "seeds": args.seeds,
                "reward_gain_mean": mean_std(gain)[0], "reward_gain_std": mean_std(gain)[1],
                "accuracy_before": mean_std(acc0)[0],
                "accuracy_after_mean": mean_std(acc)[0], "accuracy_after_std": mean_std(acc)[1],
                "accuracy_min": min(acc), "vnorm_ratio_mean": mean_std(ratio)[0],
                "curves": [[(e["step"], e["eval/reward"], e["eval/class_accuracy"])
                            for e in x["evals"]] for x in runs],
            })  # fmt: skip
    print_table(
        rows,
        [
            ("variant", "variant"),
            ("reward", "reward"),
            ("reward_gain_mean", "reward gain"),
            ("reward_gain_std", "±"),
            ("accuracy_before", "acc before"),
            ("accuracy_after_mean", "acc after"),
            ("accuracy_min", "acc, worst seed"),
            ("vnorm_ratio_mean", "|v|/|v_ref|"),
        ],
    )
    hack = {r["variant"]: r for r in rows if r["reward"] == "hackable"}
    plain, recipe = hack.get("ram (m=30, no guard)"), hack.get("ram (recipe)")
    write_result(
        args.out,
        name="ram_defaults",
        catalog_ids=["001-01", "004-28"],
        config={**vars(args), "seconds": round(time.perf_counter() - t0, 1)},
        seeds=args.seeds,
        rows=rows,
        headline={
            "metric": "class accuracy after RAM on the hackable reward: the recipe's defaults "
            "(value) against m=30 without a guard (baseline)",
            "value": recipe["accuracy_after_mean"] if recipe else None,
            "baseline": plain["accuracy_after_mean"] if plain else None,
            "ratio": (recipe["accuracy_after_mean"] / plain["accuracy_after_mean"])
            if recipe and plain and plain["accuracy_after_mean"]
            else None,
            "paper": "RAM (001-01) does not report this; NormGuard (004-28): norm inflation "
            "is what reward hacking in flow models looks like",
        },
    )


if __name__ == "__main__":
    main()
