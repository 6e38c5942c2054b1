"""PAC-ACT benchmark: success and force safety of a BC ACT policy on ``contour`` before and
after online chunk-level actor-critic fine-tuning, against an unconstrained actor-critic.

Command (defaults; writes bench_results/pac_act.json)::

    uv run --frozen python tools/bench_pac_act.py --seeds 0 1 2 --episodes 160 \\
        --eval-episodes 100 --workers 2 --out bench_results/pac_act.json

The cached demonstration set (10 good + 30 poor scripted episodes, a LeRobotDataset) and
lerobot's ACT behaviour-cloned on it (``rlpost.robot.pretrain.build_act_policy``) are the
starting point of every method and seed:

* ``bc``: the BC ACT policy, not fine-tuned;
* ``pac_act``: PAC-ACT with the defaults of the ``pac_act_contour`` recipe (hybrid
  behaviour prior, force-safety reward terms);
* ``ac``: the same actor-critic without the behaviour prior (``prior_coef = 0``);
* ``pac_act_noforce``: PAC-ACT without the force-safety terms (task reward only, which
  already charges ``0.1 max(0, F - 8 N) / 5 N`` per step);
* ``pac_act_strongforce``: PAC-ACT with 5x the force-safety terms (0.5 and 0.1).

Metrics over ``--eval-episodes`` fresh episodes (seeds 10_000 + i, the same for every
method), chunks executed open loop: success, mean per-episode peak contact force and the
fraction of control steps whose force exceeds the 8 N threshold (60 % above the nominal
5 N). Runs are separate processes with one thread.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import mean_std, print_table, run_pool, write_result

TASK = "contour"
METHODS = {
    "bc": None,
    "pac_act": {},
    "ac": {"prior_coef": 0.0},
    "pac_act_noforce": {"force_excess_coef": 0.0, "force_violation_coef": 0.0},
    "pac_act_strongforce": {"force_excess_coef": 0.5, "force_violation_coef": 0.1},
}
METRICS = ("success", "peak_force", "frac_force_above", "return")


@functools.cache
def _recipe() -> Any:
    from rlpost.robot.config import load_config, recipe_path

    return load_config(recipe_path("pac_act_contour"))


def _policy_folder() -> Path:
    from rlpost.robot.train import build_policy_for

    return build_policy_for(_recipe())


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from rlpost.robot.algos.common import evaluate_policy
    from rlpost.robot.algos.pac_act import PACACTConfig, run_pac_act
    from rlpost.robot.pretrain import build_demo_dataset, load_bc_policy, load_demos

    t0 = time.perf_counter()
    pi = load_bc_policy(_policy_folder())
    history = None
    if METHODS[job["method"]] is not None:
        demos = load_demos(build_demo_dataset(TASK))
        kw = {**_recipe().algo.params, "episodes": job["episodes"]}
        cfg = PACACTConfig(**{**kw, **METHODS[job["method"]]}, seed=job["seed"])
        history = run_pac_act(pi, TASK, demos, cfg, progress=False)["history"]
    ev = evaluate_policy(pi, TASK, job["eval_episodes"], 1, seed=10_000)
    return {**job, **ev, "seconds_train": time.perf_counter() - t0, "history": history}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--episodes", type=int, default=160)
    ap.add_argument("--eval-episodes", type=int, default=100)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench_results/pac_act.json")
    args = ap.parse_args()

    _policy_folder()  # build the cached demos and BC ACT before the workers start
    jobs = [
        {"method": m, "seed": s, "episodes": args.episodes, "eval_episodes": args.eval_episodes}
        for m in args.methods
        for s in (args.seeds if METHODS[m] is not None else args.seeds[:1])
    ]
    t0 = time.perf_counter()
    results = run_pool(
        run_job,
        jobs,
        args.workers,
        lambda r: (
            f"{r['method']:<20} seed {r['seed']}  success {r['success']:.2f}  "
            f"peak {r['peak_force']:.1f} N  above {r['frac_force_above']:.1%}"
        ),
    )
    rows = []
    for m in args.methods:
        rs = [r for r in results if r["method"] == m]
        row: dict[str, Any] = {"method": m, "seeds": len(rs)}
        for k in METRICS:
            row[k], row[f"{k}_std"] = mean_std([r[k] for r in rs])
        row["train_s"] = mean_std([r["seconds_train"] for r in rs])[0]
        rows.append(row)
    print(
        f"\n{TASK}: {args.eval_episodes} eval episodes (mean ± std over seeds {args.seeds}); "
        f"fine-tuning budget {args.episodes} episodes; force threshold 8 N"
    )
    cols = [("method", "method")]
    for k, label in zip(METRICS, ("success", "peak N", "> 8 N", "return"), strict=True):
        cols += [(k, label), (f"{k}_std", "±")]
    cols += [("train_s", "train s")]
    print_table(rows, cols)
    by = {r["method"]: r for r in rows}
    headline: dict[str, Any] = {
        "metric": "success after fine-tuning (no PAC-ACT run)",
        "value": None,
        "baseline": None,
        "ratio": None,
        "paper": "success up, force readings above 60 N cut 46x on Contour",
    }
    if "bc" in by and "pac_act" not in by and "pac_act_noforce" in by:
        bc, pa = by["bc"], by["pac_act_noforce"]
        headline.update(
            metric="success, PAC-ACT without the force terms / BC",
            value=pa["success"],
            baseline=bc["success"],
            ratio=pa["success"] / max(bc["success"], 1e-9),
        )
    if "bc" in by and "pac_act" in by:
        bc, pa = by["bc"], by["pac_act"]
        headline.update(
            metric="fraction of force readings above 8 N, BC / PAC-ACT",
            value=pa["frac_force_above"],
            baseline=bc["frac_force_above"],
            ratio=bc["frac_force_above"] / max(pa["frac_force_above"], 1e-9),
        )
    out = write_result(
        args.out,
        name="pac_act",
        catalog_ids=["004-10"],
        config=vars(args),
        seeds=args.seeds,
        rows=rows,
        headline=headline,
    )
    print(f"\nwrote {out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
