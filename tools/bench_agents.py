"""Multi-turn agents on CPU (issue 20): GRPO vs StepOPSD (000-03) vs A²TGPO (001-15) on the
household text world, from its tiny base.

The base (:func:`rlpost.llm.envs.pretrain.build_env_base`, cached) is SFT-trained on
scripted demonstrations that search the house in a random order; half of them start with a
hindsight hint (the episode's own solution), so the policy can also follow a hint. The
world hides a regularity: each object usually lies at its home place. Under a tight turn
budget, looking at an object's home first is what RL can find. From the same base:

* ``grpo``: the trajectory's outcome advantage on every action token;
* ``step_opsd``: the same advantage redistributed over the steps by the policy's own
  log-prob gap under a hindsight context (the group's shortest solved episode as a hint),
  never changing its sign;
* ``a2tgpo``: turn-group-normalised per-turn progress (the world's ``gain``: sub-goals
  completed by the turn) accumulated with variance rescaling, plus the outcome advantage,
  with adaptive turn-level clip ranges.

Prints held-out greedy success before and after per method (mean of seeds), writes the
common JSON shape and a PNG of the curves.

    uv run --frozen python tools/bench_agents.py            # about 25 min on 2 cores
    uv run --frozen python tools/bench_agents.py --quick    # a smoke run
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

METHODS = {
    "grpo": ["algo.preset=grpo"],
    "step_opsd": [
        "algo.preset=step_opsd",
        "distill.teachers=[{path: self, template: '{hindsight}{prompt}'}]",
    ],
    "a2tgpo": ["algo.preset=a2tgpo"],
}


def job(spec: dict) -> dict[str, Any]:
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    run_dir = Path(spec["root"]) / f"{spec['name']}-{spec['seed']}"
    env = spec["env"]
    cfg = load_config(
        None,
        [
            "model.path=tiny",
            f"data.env={{name: {env}, params: {{budget: {spec['budget']}}}, "
            f"max_turns: {spec['budget']}}}",
            f"data.eval_size={spec['eval_size']}", f"rollout.prompts_per_step={spec['prompts']}",
            f"rollout.group_size={spec['group_size']}", "rollout.max_new_tokens=3",
            "rollout.temperature=1.0", f"optim.lr={spec['lr']}",
            f"optim.micro_batch_size={spec['group_size'] * spec['prompts']}",
            "algo.kl_coef=0.0", f"train.steps={spec['steps']}",
            f"run.eval_every={max(1, spec['steps'] // 6)}", "run.save_every=0",
            f"run.seed={spec['seed']}", "run.threads=1", "run.progress=false",
            "run.tensorboard=false", "reward.workers=0", f"run.dir={run_dir}",
            *METHODS[spec["name"]],
        ],
    )  # fmt: skip
    t0 = time.perf_counter()
    Trainer(cfg).train()
    rows = read_metrics(run_dir)
    curve = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    turns = [r["env/turns"] for r in rows if "env/turns" in r]
    return {
        "name": spec["name"],
        "seed": spec["seed"],
        "seconds": time.perf_counter() - t0,
        "curve": curve,
        "turns_first": turns[0],
        "turns_last": sum(turns[-5:]) / len(turns[-5:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="household")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="bench_results/llm_agents.json")
    ap.add_argument("--plot", default="docs/img/agents_household.png")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.prompts, a.group_size, a.eval_size, a.seeds = 2, 2, 4, 16, [0]
        a.out, a.plot = "bench_results/llm_agents_quick.json", "/tmp/agents_quick.png"
    from rlpost.llm.envs.pretrain import build_env_base

    t0 = time.perf_counter()
    base = build_env_base(a.env)  # cached; built once (about 8 min) before the jobs
    with tempfile.TemporaryDirectory(prefix="bench_agents_") as tmp:
        spec = {
            "root": tmp, "env": a.env, "budget": a.budget, "eval_size": a.eval_size,
            "prompts": a.prompts, "group_size": a.group_size, "lr": a.lr, "steps": a.steps,
        }  # fmt: skip
        jobs = [{**spec, "name": n, "seed": s} for n in METHODS for s in a.seeds]
        done = run_pool(
            job, jobs, 2, lambda r: f"{r['name']} seed {r['seed']}: {r['curve'][-1][1]:.3f}"
        )
    rows, curves = [], {}
    for name in METHODS:
        runs = sorted((r for r in done if r["name"] == name), key=lambda r: r["seed"])
        curves[name] = [r["curve"] for r in runs]
        row: dict[str, Any] = {"method": name}
        row["before"] = runs[0]["curve"][0][1]
        row["after"], row["after_std"] = mean_std(r["curve"][-1][1] for r in runs)
        row["best"], _ = mean_std(max(v for _, v in r["curve"]) for r in runs)
        row["turns_first"], _ = mean_std(r["turns_first"] for r in runs)
        row["turns_last"], _ = mean_std(r["turns_last"] for r in runs)
        row["seconds"], _ = mean_std(r["seconds"] for r in runs)
        row["curves"] = curves[name]
        rows.append(row)
    print_table(
        rows, ["method", "before", "after", "after_std", "best", "turns_first", "turns_last",
               "seconds"],
    )  # fmt: skip
    plot_mean_curves(
        curves,
        a.plot,
        x=0,
        y=1,
        xlabel="step",
        ylabel=f"held-out greedy success ({a.budget} turns)",
        title=f"multi-turn agents, tiny model, {a.env} world",
    )
    by = {r["method"]: r for r in rows}
    write_result(
        a.out,
        name="llm_agents",
        catalog_ids=["000-03", "001-15"],
        config={**vars(a), "base": str(base)},
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": f"held-out greedy success on the {a.env} world after {a.steps} steps, "
            "StepOPSD vs GRPO",
            "value": by["step_opsd"]["after"],
            "baseline": by["grpo"]["after"],
            "ratio": by["step_opsd"]["after"] / by["grpo"]["after"]
            if by["grpo"]["after"]
            else None,
            "paper": "StepOPSD is best or second-best on ALFWorld Heat / PickTwo (000-03); "
            "A²TGPO's turn-level credit beats outcome-only GRPO (001-15)",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
