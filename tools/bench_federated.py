"""Federated GRPO against centralised GRPO on the same samples (issue 19, catalog 001-07).

From the embedded tiny base on 2-digit addition, every configuration uses the same number
of rollouts per round: centralised GRPO takes ``clients x prompts`` prompts per step;
federated training splits them over ``clients`` clients (IID shards, ``prompts`` each, one
local step per update). Compared in one run:

* ``centralised``: one trainer, ``clients x prompts`` prompts per step;
* ``fedavg``: synchronous FedAvg rounds, dense updates;
* ``fedavg-topk``: the same, top-10 % sparsified updates with error feedback;
* ``fedavg-int8``: the same, int8-quantised updates with error feedback;
* ``async-topk``: the clients as Ray actors, each top-10 % update applied as it arrives
  with the (1 + s)^-0.5 staleness discount.

Held-out greedy accuracy of the (server's) model every ``--eval-every`` rounds against the
rollouts used, the bytes sent, and the wall time: a table, the common JSON shape and a PNG.

    uv run --frozen python tools/bench_federated.py            # about 12 min on 2 cores
    uv run --frozen python tools/bench_federated.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, plot_mean_curves, print_table, run_pool, write_result

CONFIGS = {
    "centralised": None,
    "fedavg": ("local", "none"),
    "fedavg-topk": ("local", "topk"),
    "fedavg-int8": ("local", "int8"),
    "async-topk": ("ray", "topk"),
}


def job(spec: dict) -> dict[str, Any]:
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.runtimes.federated import run_federated
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    name, k, p, g = spec["name"], spec["clients"], spec["prompts"], spec["group_size"]
    run_dir = Path(spec["root"]) / f"{name}-{spec['seed']}"
    common = [
        "model.path=tiny", "data.task=arithmetic", "data.task_params={digits: 2}",
        f"data.eval_size={spec['eval_size']}", f"rollout.group_size={g}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}", "rollout.temperature=1.0",
        f"optim.lr={spec['lr']}", "algo.kl_coef=0.0", f"run.seed={spec['seed']}",
        f"data.seed={spec['seed']}", "run.threads=1", "run.progress=false",
        "run.tensorboard=false", "reward.workers=0", "run.save_every=0", f"run.dir={run_dir}",
    ]  # fmt: skip
    t0 = time.perf_counter()
    how = CONFIGS[name]
    if how is None:
        cfg = load_config(
            None,
            [
                *common, f"rollout.prompts_per_step={k * p}",
                f"optim.micro_batch_size={k * p * g}", f"train.steps={spec['rounds']}",
                f"run.eval_every={spec['eval_every']}",
            ],
        )  # fmt: skip
        Trainer(cfg).train()
        rows = read_metrics(run_dir)
        curve = [
            [r["step"], r["step"] * k * p * g, r["eval/accuracy"]]
            for r in rows
            if "eval/accuracy" in r
        ]
        sent = None
    else:
        backend, comp = how
        cfg = load_config(
            None,
            [
                *common, f"rollout.prompts_per_step={p}", f"optim.micro_batch_size={p * g}",
                "run.eval_every=0",
                f"federated={{clients: {k}, rounds: {spec['rounds']}, local_steps: 1, "
                f"compression: {comp}, ratio: 0.1, backend: {backend}, workers: {k}, "
                f"eval_every: {spec['eval_every']}}}",
            ],
        )  # fmt: skip
        s = run_federated(cfg, progress=False)
        curve = [[u // k, n, a] for u, n, a in s["curve"]]
        sent = s["compression_ratio"]
    return {
        "name": name,
        "seed": spec["seed"],
        "curve": curve,
        "bytes_vs_dense": sent,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8, help="per client per round")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="bench_results/llm_federated.json")
    ap.add_argument("--plot", default="docs/img/federated_vs_centralised.png")
    a = ap.parse_args()
    if a.quick:
        a.clients, a.prompts, a.rounds, a.eval_every, a.eval_size, a.seeds = 2, 2, 2, 1, 16, [0]
        a.out, a.plot = "bench_results/llm_federated_quick.json", "/tmp/federated_quick.png"
    from rlpost.llm.model import tiny

    tiny.build_base("arithmetic", digits=2)  # (cached) before the timed runs
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_federated_") as tmp:
        spec = {
            "root": tmp, "clients": a.clients, "prompts": a.prompts, "group_size": a.group_size,
            "rounds": a.rounds, "eval_every": a.eval_every, "max_new_tokens": a.max_new_tokens,
            "lr": a.lr, "eval_size": a.eval_size,
        }  # fmt: skip
        local = [
            {**spec, "name": n, "seed": s} for n in CONFIGS if n != "async-topk" for s in a.seeds
        ]
        done = run_pool(
            job, local, 2, lambda r: f"{r['name']} seed {r['seed']}: {r['curve'][-1][2]:.3f}"
        )
        for s in a.seeds:  # the Ray run on its own: its actors take the CPUs
            done.append(job({**spec, "name": "async-topk", "seed": s}))
            print(f"  done async-topk seed {s}: {done[-1]['curve'][-1][2]:.3f}", flush=True)
    rows, curves = [], {}
    for name in CONFIGS:
        runs = sorted((r for r in done if r["name"] == name), key=lambda r: r["seed"])
        curves[name] = [r["curve"] for r in runs]
        row: dict[str, Any] = {"config": name, "rollouts": runs[0]["curve"][-1][1]}
        row["before"], _ = mean_std(r["curve"][0][2] for r in runs)
        half = len(runs[0]["curve"]) // 2
        row["mid"], _ = mean_std(r["curve"][half][2] for r in runs)
        row["after"], row["after_std"] = mean_std(r["curve"][-1][2] for r in runs)
        row["bytes_vs_dense"] = runs[0]["bytes_vs_dense"]
        row["seconds"], _ = mean_std(r["seconds"] for r in runs)
        row["curves"] = curves[name]
        rows.append(row)
    print_table(
        rows,
        ["config", "rollouts", "before", "mid", "after", "after_std", "bytes_vs_dense", "seconds"],
    )
    plot_mean_curves(
        curves,
        a.plot,
        x=1,
        y=2,
        xlabel="rollouts",
        ylabel="held-out greedy accuracy",
        title="federated vs centralised GRPO, tiny model, 2-digit addition",
    )
    by = {r["config"]: r for r in rows}
    write_result(
        a.out,
        name="llm_federated",
        catalog_ids=["001-07"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": "held-out accuracy after the same rollouts, asynchronous top-10 % "
            "federated vs centralised GRPO",
            "value": by["async-topk"]["after"],
            "baseline": by["centralised"]["after"],
            "ratio": by["async-topk"]["after"] / by["centralised"]["after"],
            "paper": "communication-efficient asynchronous federated policy updates match "
            "centralised training on IID data (001-07)",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
