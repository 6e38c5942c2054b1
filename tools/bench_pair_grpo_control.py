"""Pair-GRPO control benchmark (catalog 001-14b): Soft-Pair-GRPO against GRPO with scalar
rewards on MuJoCo HalfCheetah, from scratch, same budget.

Command (defaults; writes bench_results/pair_grpo_control.json and
docs/img/pair_grpo_control.png)::

    uv run --frozen python tools/bench_pair_grpo_control.py --seeds 0 1 2 --iterations 200

Each run is ``rlpost-robot control --config pair_grpo_half_cheetah`` with ``preset=grpo``
or ``preset=soft_pair_grpo``: groups of 8 rollouts of 200 steps from one initial state, 4
groups per iteration, PPO clip 0.2, 4 epochs, no KL by default (``--kl-coef 0.04``: the
presets' k3 KL to the initial policy, which held both near the random start). The
two presets differ only in the advantage: the group-normalised return, or the pairwise
win rate minus 1/2. The return is the mean action's over 8 fixed evaluation seeds, every
10 iterations. Runs are separate processes with one thread, two at a time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import mean_std, plot_mean_curves, print_table, run_pool, write_result

PRESETS = ("grpo", "soft_pair_grpo")


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from rlpost.robot.config import load_job, recipe_path
    from rlpost.robot.control import run_control

    cfg = load_job(
        "control",
        recipe_path("pair_grpo_half_cheetah", "control"),
        [f"preset={job['preset']}", f"iterations={job['iterations']}", f"run.seed={job['seed']}",
         f"run.dir={job['run']}", f"kl_coef={job['kl_coef']}", "run.progress=false", "run.threads=1"],
    )  # fmt: skip
    r = run_control(cfg, overwrite=True)
    curve = [(h["env_steps"], h["eval_return"]) for h in r["history"] if "eval_return" in h]
    return {**job, "final": r["final_eval_return"], "best": r["best_eval_return"], "curve": curve,
            "sampled_last10": sum(h["return"] for h in r["history"][-10:]) / 10, "seconds": r["seconds"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--kl-coef", type=float, default=0.0, help="k3 KL weight (presets: 0.04)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", default="runs/bench_pair_grpo_control")
    ap.add_argument("--out", default="bench_results/pair_grpo_control.json")
    ap.add_argument("--plot", default="docs/img/pair_grpo_control.png")
    args = ap.parse_args()
    jobs = [
        {
            "preset": p,
            "seed": s,
            "iterations": args.iterations,
            "kl_coef": args.kl_coef,
            "run": f"{args.runs}/{p}-s{s}",
        }
        for s in args.seeds
        for p in PRESETS
    ]
    results = run_pool(
        run_job, jobs, args.workers, lambda r: f"{r['preset']} seed {r['seed']}: {r['final']:.1f}"
    )
    rows = []
    for p in PRESETS:
        mine = sorted((r for r in results if r["preset"] == p), key=lambda r: r["seed"])
        final, final_std = mean_std(r["final"] for r in mine)
        best, best_std = mean_std(r["best"] for r in mine)
        sampled, _ = mean_std(r["sampled_last10"] for r in mine)
        rows.append({"preset": p, "final_return": final, "final_std": final_std, "best_return": best,
                     "best_std": best_std, "sampled_last10": sampled, "per_seed_final": [r["final"] for r in mine],
                     "curves": [r["curve"] for r in mine], "seconds": mean_std(r["seconds"] for r in mine)[0]})  # fmt: skip
    print_table(
        rows, ["preset", "final_return", "final_std", "best_return", "sampled_last10", "seconds"]
    )
    grpo, pair = rows
    write_result(
        args.out,
        name="pair_grpo_control",
        catalog_ids=["001-14"],
        config={"env_id": "HalfCheetah-v5", "iterations": args.iterations, "starts": 4, "group_size": 8, "horizon": 200, "epochs": 4, "kl_coef": args.kl_coef},
        seeds=args.seeds,
        rows=rows,
        headline={
            "metric": "HalfCheetah-v5 evaluation return after the budget (mean action, 200 steps)",
            "value": pair["final_return"],
            "baseline": grpo["final_return"],
            "ratio": pair["final_return"] / grpo["final_return"] if grpo["final_return"] else None,
            "paper": "Pair-GRPO outperforms baselines on HalfCheetah-v4 (no number in the abstract)",
        },
    )  # fmt: skip
    plot_mean_curves(
        {r["preset"]: r["curves"] for r in rows}, args.plot, x=0, y=1,
        xlabel="environment steps", ylabel="evaluation return (200 steps)",
        title="HalfCheetah-v5: Soft-Pair-GRPO vs GRPO",
    )  # fmt: skip
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
