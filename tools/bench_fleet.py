"""LWD fleet benchmark (catalog 001-23): success against fleet experience for fleets of
1, 4 and 8 robots over the same wall time.

Command (defaults; writes bench_results/fleet.json and docs/img/fleet_curves.png)::

    uv run --frozen python tools/bench_fleet.py --robots 1 4 8 --minutes 5 --seeds 0 \\
        --snapshot-every 25 --eval-episodes 20

Each run is ``rlpost-robot fleet`` (the ``lwd_multimodal_reach`` fleet recipe) with
``--robots N`` for ``--minutes`` minutes of fleet time (after the learner's offline phase
on the demonstrations), its learner saving the policy every ``--snapshot-every``
versions. Robot ``i`` takes variant ``i mod 8`` of the eight default variants (nominal,
weak / strong servo, heavy, slope, far goals, noisy, near goals + damped): a fleet of one
is the nominal robot alone. Afterwards every snapshot (and the BC policy) is evaluated
on *all eight* variants, ``--eval-episodes`` held-out episodes each, with no operator:
the generalist's success, against the experience the fleet had collected when the
snapshot was taken. The runs are sequential (one fleet at a time on the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import mean_std, print_table, write_result


def evaluate_snapshots(run: Path, task: str, episodes: int, steps: int) -> list[dict[str, Any]]:
    """Mean held-out success over every variant of each ``policies/v-*`` snapshot, with
    the episodes the fleet had collected by that version (from ``metrics.jsonl``)."""
    import numpy as np

    from rlpost.robot.fleet.job import evaluate_variants
    from rlpost.robot.fleet.variants import DEFAULT_VARIANTS
    from rlpost.robot.policies.flow import FlowChunkPolicy

    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    at = {int(r["version"]): (int(r["episodes"]), float(r["seconds"])) for r in rows}
    before = json.loads((run / "eval_before.json").read_text())
    points = [
        {
            "version": 0,
            "episodes": 0,
            "seconds": 0.0,
            "success": float(np.mean(list(before.values()))),
            "per_variant": before,
        }
    ]
    for snap in sorted((run / "policies").glob("v-*")):
        v = int(snap.name[2:])
        policy = FlowChunkPolicy.load(snap).eval()
        per = evaluate_variants(
            task, policy, list(DEFAULT_VARIANTS), episodes, steps, workdir=run / "robots"
        )
        eps, secs = at.get(v, (None, None))
        points.append(
            {
                "version": v,
                "episodes": eps,
                "seconds": secs,
                "success": float(np.mean(list(per.values()))),
                "per_variant": per,
            }
        )
    return points


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--robots", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--snapshot-every", type=int, default=25)
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--runs", default="runs/bench_fleet")
    ap.add_argument("--out", default="bench_results/fleet.json")
    ap.add_argument("--plot", default="docs/img/fleet_curves.png")
    ap.add_argument("overrides", nargs="*", help="recipe overrides for every run (key=value)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from rlpost.robot.config import load_job, recipe_path
    from rlpost.robot.fleet.job import run_fleet

    results = []
    for seed in args.seeds:
        for n in args.robots:
            run = Path(args.runs) / f"n{n}-s{seed}"
            job = load_job(
                "fleet",
                recipe_path("lwd_multimodal_reach", "fleet"),
                [f"fleet.robots={n}", f"fleet.minutes={args.minutes}", f"run.dir={run}", f"run.seed={seed}",
                 f"learner.snapshot_every={args.snapshot_every}", f"fleet.eval_episodes={args.eval_episodes}",
                 "run.progress=false", *args.overrides],
            )  # fmt: skip
            t0 = time.perf_counter()
            r = run_fleet(job, overwrite=True)
            lwd = job.learner.algo_config(seed)
            curve = evaluate_snapshots(run, job.task, args.eval_episodes, lwd.sample_steps)
            final = {
                "version": r["version"],
                "episodes": r["episodes"],
                "seconds": job.fleet.minutes * 60,
                "success": float(sum(r["after"].values()) / len(r["after"])),
                "per_variant": r["after"],
            }
            curve.append(final)
            results.append(
                {
                    "robots": n,
                    "seed": seed,
                    "result": r,
                    "curve": curve,
                    "wall_s": time.perf_counter() - t0,
                }
            )
            print(
                f"N={n} seed={seed}: {r['episodes']} episodes, {r['updates']} updates, success {curve[0]['success']:.3f} -> {final['success']:.3f} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )

    rows = []
    for n in args.robots:
        mine = [x for x in results if x["robots"] == n]
        before, _ = mean_std(x["curve"][0]["success"] for x in mine)
        after, after_std = mean_std(x["curve"][-1]["success"] for x in mine)
        peak, _ = mean_std(max(c["success"] for c in x["curve"]) for x in mine)
        nominal, _ = mean_std(x["result"]["after"]["nominal"] for x in mine)
        others, _ = mean_std(
            sum(v for k, v in x["result"]["after"].items() if k != "nominal") / 7 for x in mine
        )
        rows.append({
            "robots": n,
            "episodes": mean_std(x["result"]["episodes"] for x in mine)[0],
            "env_steps": mean_std(x["result"]["steps"] for x in mine)[0],
            "intervened": mean_std(x["result"]["interventions"] / max(1, x["result"]["episodes"]) for x in mine)[0],
            "updates": mean_std(x["result"]["updates"] for x in mine)[0],
            "stale": mean_std(x["result"]["stale"] for x in mine)[0],
            "success_before": before,
            "success_after": after,
            "success_after_std": after_std,
            "success_peak": peak,
            "nominal_after": nominal,
            "other_variants_after": others,
            "curves": [x["curve"] for x in mine],
        })  # fmt: skip
    print_table(
        rows,
        ["robots", "episodes", "env_steps", "intervened", "updates", "stale", "success_before",
         "success_peak", "success_after", "nominal_after", "other_variants_after"],
    )  # fmt: skip
    one = next((r for r in rows if r["robots"] == min(args.robots)), rows[0])
    big = next((r for r in rows if r["robots"] == max(args.robots)), rows[-1])
    write_result(
        args.out,
        name="fleet",
        catalog_ids=["001-23"],
        config={"robots": args.robots, "minutes": args.minutes, "snapshot_every": args.snapshot_every, "eval_episodes": args.eval_episodes, "overrides": args.overrides},
        seeds=args.seeds,
        rows=rows,
        headline={
            "metric": f"mean held-out success over 8 robot variants after {args.minutes} min, {max(args.robots)} robots vs {min(args.robots)}",
            "value": big["success_after"],
            "baseline": one["success_after"],
            "ratio": big["success_after"] / one["success_after"] if one["success_after"] else None,
            "paper": "a single generalist policy improves with fleet experience to 95% average success (16 robots, 8 real tasks)",
        },
    )  # fmt: skip
    _plot(rows, args.plot)
    print(f"wrote {args.out} and {args.plot}")


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in rows:
        for i, c in enumerate(r["curves"]):
            pts = [p for p in c if p["episodes"] is not None]
            kw = {"label": f"{r['robots']} robot{'s' if r['robots'] > 1 else ''}"} if i == 0 else {}
            color = f"C{rows.index(r)}"
            axes[0].plot(
                [p["episodes"] for p in pts],
                [p["success"] for p in pts],
                "o-",
                ms=3,
                color=color,
                **kw,
            )
            axes[1].plot(
                [p["seconds"] / 60 for p in pts],
                [p["success"] for p in pts],
                "o-",
                ms=3,
                color=color,
                **kw,
            )
    axes[0].set(
        xlabel="fleet experience (episodes)", ylabel="held-out success, 8 variants", ylim=(0, 1)
    )
    axes[1].set(xlabel="fleet time (minutes)", ylabel="held-out success, 8 variants", ylim=(0, 1))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
