"""Value retention (catalog 001-25's study) on the tiny model: which post-training data
keeps what the base learned before it.

The paper compares post-training domains (helpfulness against coding) by how much of a
mid-trained value each keeps. Our stand-ins, from the same tiny base (pre-trained on
2-digit addition, the "value" to keep): ``chat``, RLHF on open-ended number talk (the
``grlo_chat`` recipe, a helpfulness-like, judged domain), and ``add1``, RLVR on 1-digit
addition (a verifiable, narrow domain, like coding). Each runs ``--steps`` steps with a
checkpoint every ``--every``; ``rlpost-llm retention``'s library call then probes 2-digit
addition (the value), 1-digit addition and countdown at every checkpoint. Reported, mean
and spread over seeds, per run and probe: accuracy at step 0 and at the end. The paper
finds helpfulness training degrading the mid-trained value far more than coding training
(ANIMA, SFT 35.7 % vs 65.2 %, GRPO 18.7 % vs 32.0 %).

    uv run --frozen python tools/bench_retention.py --steps 100 --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, print_table, write_result
from llm_demo_runs import train_demo

from rlpost.llm.model.tiny import build_base
from rlpost.llm.tools.retention import retention

PROBES = ["arithmetic:{digits: 2}", "arithmetic:{digits: 1}", "countdown"]
RUNS = {"chat": ("grlo_chat", []), "add1": ("grpo_arithmetic", ["data.task_params={digits: 1}"])}
# (both from the 2-digit addition base: a 1-digit run would otherwise get its own tiny base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_results/retention.json")
    a = ap.parse_args()
    a.eval_every = a.steps
    t0 = time.perf_counter()
    per_seed = []
    base = build_base("arithmetic", progress=False, digits=2, ops="+")
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.seeds:
            dirs = {}
            for name, (recipe, extra) in RUNS.items():
                dirs[name] = Path(tmp) / f"{name}-{s}"
                train_demo(dirs[name], s, a, [f"run.save_every={a.every}", f"model.path={base}",
                                              "run.keep_checkpoints=100", *extra], recipe)  # fmt: skip
            table = retention(list(dirs.values()), PROBES, Path(tmp) / f"ret-{s}", a.size)
            per_seed.append({n: table["runs"][str(d)] for n, d in dirs.items()})
    rows = []
    for name in RUNS:
        for probe in PROBES:
            start = mean_std(t[name][0][probe] for t in per_seed)
            end = mean_std(t[name][-1][probe] for t in per_seed)
            rows.append({"run": name, "probe": probe, "start": start[0], "end": end[0],
                         "end_std": end[1], "change": end[0] - start[0]})  # fmt: skip
    print_table(rows, ["run", "probe", "start", "end", "end_std", "change"])
    by = {(r["run"], r["probe"]): r for r in rows}
    write_result(
        a.out,
        name="retention",
        catalog_ids=["001-25"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": "2-digit addition (the base's value) kept after post-training: chat RLHF "
            "vs 1-digit addition RLVR",
            "value": by[("chat", PROBES[0])]["end"],
            "baseline": by[("add1", PROBES[0])]["end"],
            "ratio": by[("chat", PROBES[0])]["end"] / max(by[("add1", PROBES[0])]["end"], 1e-9),
            "paper": "helpfulness post-training degrades a mid-trained value far more than coding "
            "post-training",
        },
    )
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
