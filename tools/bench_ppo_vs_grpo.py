"""PPO with a critic against GRPO on the LLM demo task (issue 14).

Both run the shipped recipes on the embedded tiny model (2-digit addition, 32 prompts x 8
samples per step, the same learning rate and seed): ``grpo_arithmetic`` (group-relative
advantages, critic-free) and ``ppo_arithmetic`` (GAE on a value head over a copy of the
policy's decoder, clipped value loss, 10 critic-warmup steps). Reported per method, mean
and spread over seeds: greedy held-out accuracy before / after, its best, the final
training reward, seconds per step; for PPO the value loss and the explained variance of
the critic at the start and the end. Writes the common JSON shape and a PNG with the
held-out accuracy of both and PPO's value-loss curve.

    uv run --frozen python tools/bench_ppo_vs_grpo.py --steps 200 --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import print_table, seed_row, write_result

from rlpost.llm.config import load_config
from rlpost.llm.recipes import recipe_path
from rlpost.llm.tools.runlog import read_metrics
from rlpost.llm.trainer import Trainer

METHODS = {"grpo": "grpo_arithmetic", "ppo": "ppo_arithmetic"}


def run(method: str, a: argparse.Namespace, seed: int, root: Path) -> dict:
    run_dir = root / f"{method}-{seed}"
    cfg = load_config(
        recipe_path(METHODS[method]),
        [
            f"run.dir={run_dir}",
            f"run.seed={seed}",
            f"train.steps={a.steps}",
            f"run.eval_every={a.eval_every}",
            "run.save_every=0",
            f"run.threads={a.threads}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    t0 = time.perf_counter()
    Trainer(cfg).train()
    seconds = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    ev = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if r["step"] > 0]
    out = {
        "eval_before": ev[0][1],
        "eval_after": ev[-1][1],
        "eval_best": max(v for _, v in ev),
        "reward_last20": sum(r["reward/mean"] for r in train[-20:]) / len(train[-20:]),
        "s_per_step": seconds / a.steps,
        "curve": ev,
    }
    if method == "ppo":
        vl = [(r["step"], r["value/loss"]) for r in train if "value/loss" in r]
        evar = [r["value/explained_variance"] for r in train if "value/explained_variance" in r]
        out["value_curve"] = vl
        out["value_loss_first10"] = sum(v for _, v in vl[:10]) / len(vl[:10])
        out["value_loss_last10"] = sum(v for _, v in vl[-10:]) / len(vl[-10:])
        out["explained_var_first10"] = sum(evar[:10]) / len(evar[:10])
        out["explained_var_last10"] = sum(evar[-10:]) / len(evar[-10:])
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for method, runs in results.items():
        for i, r in enumerate(runs):
            s, v = zip(*r["curve"], strict=True)
            ax.plot(s, v, color="C0" if method == "grpo" else "C1", alpha=0.8,
                    label=method if i == 0 else None)  # fmt: skip
            if method == "ppo":
                s, v = zip(*r["value_curve"], strict=True)
                bx.plot(s, v, color="C1", alpha=0.8, label=f"seed {i}")
    ax.set(xlabel="step", ylabel="greedy held-out accuracy", title="GRPO vs PPO (tiny model)")
    bx.set(xlabel="step", ylabel="value loss", title="PPO critic: clipped value loss", yscale="log")
    ax.legend()
    bx.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_results/ppo_vs_grpo.json")
    ap.add_argument("--plot", default="docs/img/ppo_vs_grpo.png")
    a = ap.parse_args()
    t0 = time.perf_counter()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            results[method] = [run(method, a, s, Path(tmp)) for s in a.seeds]
    rows = [seed_row("method", method, runs) for method, runs in results.items()]
    cols = ["method", "eval_before", "eval_after", "eval_best", "reward_last20", "s_per_step"]
    print_table(rows, cols)
    ppo = rows[1]
    print_table(
        [ppo],
        ["method", "value_loss_first10", "value_loss_last10", "explained_var_first10",
         "explained_var_last10"],
    )  # fmt: skip
    plot(results, Path(a.plot))
    g = rows[0]
    write_result(
        a.out,
        name="ppo_vs_grpo",
        catalog_ids=["base"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": f"greedy held-out accuracy after {a.steps} steps (2-digit addition)",
            "value": ppo["eval_after"],
            "baseline": g["eval_after"],
            "ratio": ppo["eval_after"] / g["eval_after"] if g["eval_after"] else None,
            "paper": None,
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
