"""Mutual RL on CPU (issue 19, catalog 001-11): two heterogeneous policies trained side by
side, alone or exchanging experience by PRP, XGRPO and SGT.

The two policies are our own tiny bases on 2-digit addition, built by ``rlpost.llm.model.tiny``:

* ``char``: the character-level Qwen2 (the embedded default);
* ``bpe``: a Llama of the same size with a byte-level BPE tokenizer trained on the task's
  text (it cuts "12+34=" as "12", "+34", "="), SFT-trained by the same recipe.

Each configuration runs both as Ray actors (one CPU each) for the same steps on the same
prompt stream through ``rlpost.llm.runtimes.mutual.run_mutual``:

* ``independent``: GRPO each, no sharing (the control: the same schedule and cost);
* ``prp``: peer rollout pooling, F-TIS-weighted;
* ``xgrpo``: cross-policy advantage sharing (the peers' rewards in the baseline);
* ``sgt``: success-gated transfer (the peers' verified successes on the prompts a policy
  failed).

Prints each policy's greedy held-out accuracy before and after, and writes the common JSON
shape.

    uv run --frozen python tools/bench_mutual.py            # about 15 min on 2 cores
    uv run --frozen python tools/bench_mutual.py --quick    # a smoke run of the pipeline
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, print_table, write_result

CONFIGS = {"independent": "grpo", "prp": "prp", "xgrpo": "xgrpo", "sgt": "sgt"}


def run(a: argparse.Namespace, name: str, seed: int, root: Path) -> dict[str, Any]:
    from rlpost.llm.config import load_config
    from rlpost.llm.runtimes.mutual import run_mutual

    cfg = load_config(
        None,
        [
            "model.path=tiny",
            "data.task=arithmetic",
            "data.task_params={digits: 2}",
            f"data.eval_size={a.eval_size}",
            f"algo.preset={CONFIGS[name]}",
            "algo.kl_coef=0.0",
            "mutual.policies=[{name: char, path: tiny}, {name: bpe, path: tiny-bpe}]",
            f"rollout.group_size={a.group_size}",
            f"rollout.prompts_per_step={a.prompts}",
            f"rollout.max_new_tokens={a.max_new_tokens}",
            "rollout.temperature=1.0",
            f"optim.lr={a.lr}",
            f"optim.micro_batch_size={4 * a.prompts * a.group_size}",
            f"train.steps={a.steps}",
            f"run.eval_every={a.steps}",
            "run.save_every=0",
            f"run.seed={seed}",
            "run.threads=1",
            "run.tensorboard=false",
            "reward.workers=0",
            f"run.dir={root / f'{name}-{seed}'}",
        ],
    )
    t0 = time.perf_counter()
    s = run_mutual(cfg, progress=False)
    return {"policies": s["policies"], "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--quick", action="store_true", help="a few steps of everything")
    ap.add_argument("--out", default="bench_results/llm_mutual.json")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.prompts, a.eval_size, a.seeds = 2, 4, 16, [0]
        a.out = "bench_results/llm_mutual_quick.json"
    from rlpost.llm.model import tiny

    for kind in ("char", "bpe"):  # built (or found in the cache) before the timed runs
        tiny.build_base("arithmetic", tokenizer=kind, digits=2)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    t0 = time.perf_counter()
    done: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_mutual_") as tmp:
        for name in CONFIGS:
            for seed in a.seeds:
                r = run(a, name, seed, Path(tmp))
                done.setdefault(name, []).append(r)
                acc = ", ".join(
                    f"{p}: {v['eval_before']:.3f} -> {v['eval_after']:.3f}"
                    for p, v in r["policies"].items()
                )
                print(f"{name} seed {seed}: {acc} ({r['seconds']:.0f} s)", flush=True)
    rows = []
    for name, runs in done.items():
        for pol in ("char", "bpe"):
            ps = [r["policies"][pol] for r in runs]
            row: dict[str, Any] = {"config": name, "policy": pol, "preset": ps[0]["preset"]}
            row["before"], _ = mean_std(p["eval_before"] for p in ps)
            row["after"], row["after_std"] = mean_std(p["eval_after"] for p in ps)
            row["gain"], _ = mean_std(p["eval_after"] - p["eval_before"] for p in ps)
            row["peer_rows_trained"], _ = mean_std(p.get("trained", 0.0) for p in ps)
            row["seconds"], _ = mean_std(r["seconds"] for r in runs)
            row["per_seed_after"] = [p["eval_after"] for p in ps]
            rows.append(row)
    ray.shutdown()
    print_table(
        rows,
        ["config", "policy", "preset", "before", "after", "after_std", "gain",
         "peer_rows_trained", "seconds"],
    )  # fmt: skip

    def mean_after(config: str) -> float:
        return sum(r["after"] for r in rows if r["config"] == config) / 2

    write_result(
        a.out,
        name="llm_mutual",
        catalog_ids=["001-11", "000-09"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": "mean held-out accuracy of the two policies after training, SGT",
            "value": mean_after("sgt"),
            "baseline": mean_after("independent"),
            "ratio": mean_after("sgt") / mean_after("independent"),
            "paper": "outcome-level sharing (SGT) occupies the favourable point of the "
            "stability-support trade-off among PRP, XGRPO and SGT (001-11)",
        },
    )
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
