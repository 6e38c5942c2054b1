"""SDPO in continual post-training (catalog 004-20): GRPO against GRPO plus dense
self-distillation, on a sequence of two tasks, from a base that reads the teacher's
context.

The abstract's claims, each measured here:

* SDPO specialises faster in domain when the teacher's signal is stable and aligned
  (stage 0, whose feedback contexts the base was trained to read): held-out accuracy on
  the stage-0 task early in the stage;
* it generalises worse out of distribution: 3-digit addition, never trained on;
* in continual post-training it forgets more than GRPO: the stage-0 task's accuracy lost
  during stage 1;
* denser self-distillation drifts further in parameter space and in response space: the
  relative weight change and the per-token KL from the base on each probe's greedy
  answers (``rlpost-llm retention``), from sparse to dense: GRPO (no distillation), SDPO
  distilling only the failed responses (where the feedback says something), SDPO on every
  response (the preset), and SDPO with the distillation weighted 3;
* and the regime the abstract names for the speed-up, a stable, well-aligned teacher:
  SDPO whose teacher is told the reference answer (``:{answer}>{prompt}``, the shape of
  a remembered success the base was trained to read) instead of the feedback.

The base is ``bench_selfdistill``'s: a tiny character Qwen2 SFT-trained on 2-digit
addition, half of its prompts carrying a context ``<lessons>:<item>><prompt>`` whose item
is often the verifier's feedback on a wrong attempt. Stage 0 is 2-digit addition, stage 1
1-digit addition (same format, another answer distribution), each ``--stage-steps`` steps
(the ``sdpo_continual`` recipe's sequence has 3-digit addition second: on the embedded
base it earns almost no reward).

    uv run --frozen python tools/bench_sdpo_continual.py           # about 15 min on 2 cores
    uv run --frozen python tools/bench_sdpo_continual.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_selfdistill import FEEDBACK, build_base
from benchlib import mean_std, plot_mean_curves, print_table, write_result

PROBES = ("arithmetic:{digits: 2}", "arithmetic:{digits: 1}", "arithmetic:{digits: 3}")
ANSWER = ":{answer}>{prompt}"  # the teacher told the reference answer (a known success)

# name -> (distillation weight, distilled rows, the teacher's context); None: GRPO alone
METHODS = {
    "grpo": None,
    "sdpo, failed rows only": (1.0, "incorrect", FEEDBACK),
    "sdpo": (1.0, "all", FEEDBACK),
    "sdpo, weight 3": (3.0, "all", FEEDBACK),
    "sdpo, answer in context": (1.0, "all", ANSWER),
}


def overrides(method: tuple[float, str, str] | None) -> list[str]:
    if method is None:
        # SDPO's RL term exactly: no KL (algo.kl_coef=0 in every run), token-mean aggregation
        return ["algo.preset=grpo", "algo.aggregation={name: token_mean}", "distill.teachers=[]",
                "distill.memory=null"]  # fmt: skip
    weight, rows, template = method
    memory = "{kind: playbook, reflector: feedback, show: 3}" if template == FEEDBACK else "null"
    return [
        "algo.preset=sdpo",
        f"algo.distill_schedule={{distill_start: {weight}, distill_end: {weight}}}",
        f"algo.distill_rows={rows}",
        f"distill.teachers=[{{path: self, template: '{template}'}}]",
        f"distill.memory={memory}",
    ]


def job(spec: dict) -> dict[str, Any]:
    import torch

    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path
    from rlpost.llm.tools.retention import retention
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    torch.set_num_threads(1)
    s = spec["stage_steps"]
    run_dir = Path(spec["root"]) / f"{spec['index']}-{spec['seed']}"
    cfg = load_config(
        recipe_path("sdpo_continual"),
        [
            f"model.path={spec['base']}",
            f"data.curriculum=[{{task: arithmetic, task_params: {{digits: 2}}, steps: {s}}}, "
            f"{{task: arithmetic, task_params: {{digits: 1}}, steps: {s}}}]",
            f"data.eval_size={spec['eval_size']}", f"rollout.prompts_per_step={spec['prompts']}",
            f"optim.lr={spec['lr']}", "algo.kl_coef=0.0", f"train.steps={2 * s}",
            f"run.eval_every={spec['eval_every']}", f"run.save_every={s}",
            f"run.seed={spec['seed']}", "run.threads=1", "run.progress=false",
            "run.tensorboard=false", "reward.workers=0", f"run.dir={run_dir}",
            *overrides(spec["method"]),
        ],
    )  # fmt: skip
    t0 = time.perf_counter()
    Trainer(cfg).train()
    seconds = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    curve = [
        (r["step"], r["eval/0-arithmetic/accuracy"], r["eval/1-arithmetic/accuracy"])
        for r in rows
        if "eval/0-arithmetic/accuracy" in r
    ]
    table = retention([run_dir], list(PROBES), run_dir / "retention", size=spec["eval_size"])
    return {
        "name": spec["name"],
        "seed": spec["seed"],
        "seconds": seconds,
        "curve": curve,
        "probes": table["runs"][str(run_dir)],
    }


def summarise(name: str, runs: list[dict[str, Any]], stage_steps: int) -> dict[str, Any]:
    """The table row of one method: accuracy per task after each stage, early stage-0
    accuracy, forgetting, and drift (mean ± std over seeds)."""
    row: dict[str, Any] = {"method": name}

    def at(run: dict, step: int) -> dict:
        return next(p for p in run["probes"] if p["step"] == step)

    add2, add1, add3 = PROBES
    early = min(stage_steps // 2, stage_steps)
    for key, fn in {
        "add2_start": lambda r: at(r, 0)[add2],
        "add2_early": lambda r: next(c[1] for c in r["curve"] if c[0] >= early),
        "add2_after_stage0": lambda r: at(r, stage_steps)[add2],
        "add2_after_stage1": lambda r: at(r, 2 * stage_steps)[add2],
        "forgetting": lambda r: at(r, stage_steps)[add2] - at(r, 2 * stage_steps)[add2],
        "add1_after_stage1": lambda r: at(r, 2 * stage_steps)[add1],
        "add3_ood_start": lambda r: at(r, 0)[add3],
        "add3_ood_after_stage0": lambda r: at(r, stage_steps)[add3],
        "add3_ood_end": lambda r: at(r, 2 * stage_steps)[add3],
        "param_drift_stage0": lambda r: at(r, stage_steps)["param_drift"],
        "param_drift_end": lambda r: at(r, 2 * stage_steps)["param_drift"],
        "add2_kl_stage0": lambda r: at(r, stage_steps)[f"{add2} kl"],
        "add2_kl_end": lambda r: at(r, 2 * stage_steps)[f"{add2} kl"],
        "seconds": lambda r: r["seconds"],
    }.items():
        row[key], row[f"{key}_std"] = mean_std(fn(r) for r in runs)
    row["add2_early_step"] = early
    return row


def main() -> None:
    from benchlib import run_pool

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-steps", type=int, default=900)
    ap.add_argument("--stage-steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="bench_results/llm_sdpo_continual.json")
    ap.add_argument("--plot", default="docs/img/sdpo_continual.png")
    a = ap.parse_args()
    if a.quick:
        a.base_steps, a.stage_steps, a.prompts, a.eval_size, a.eval_every = 20, 2, 4, 16, 1
        a.seeds, a.out, a.plot = [0], "bench_results/llm_sdpo_continual_quick.json", "/tmp/sdpo.png"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_sdpo_") as tmp:
        root = Path(tmp)
        print(f"base: SFT with teacher-shaped contexts, {a.base_steps} steps", flush=True)
        base = build_base(root / "base", a.base_steps, 0)
        print(f"  base held-out: {base['plain']:.3f} plain, {base['with_feedback']:.3f} with "
              f"feedback ({base['seconds']:.0f} s)", flush=True)  # fmt: skip
        spec = {
            "root": str(root), "base": str(root / "base"), "eval_size": a.eval_size,
            "prompts": a.prompts, "lr": a.lr, "stage_steps": a.stage_steps,
            "eval_every": a.eval_every,
        }  # fmt: skip
        jobs = [
            {**spec, "name": n, "index": i, "method": m, "seed": s}
            for i, (n, m) in enumerate(METHODS.items())
            for s in a.seeds
        ]
        done = run_pool(
            job, jobs, a.workers,
            lambda r: f"{r['name']} seed {r['seed']}: add2 {r['curve'][-1][1]:.3f}",
        )  # fmt: skip
    rows, curves = [], {}
    for name in METHODS:
        runs = sorted((r for r in done if r["name"] == name), key=lambda r: r["seed"])
        rows.append({**summarise(name, runs, a.stage_steps), "runs": runs})
        curves[name] = [[(c[0], c[1]) for c in r["curve"]] for r in runs]
    print_table(
        rows,
        ["method", "add2_start", "add2_early", "add2_after_stage0", "add2_after_stage1",
         "forgetting", "forgetting_std", "add1_after_stage1", "add3_ood_after_stage0",
         "add3_ood_end", "param_drift_stage0", "param_drift_end", "add2_kl_stage0",
         "add2_kl_end"],
    )  # fmt: skip
    plot_mean_curves(
        curves, a.plot, x=0, y=1, xlabel="step (stage 1 from step "
        f"{a.stage_steps})", ylabel="held-out 2-digit addition (stage 0's task)",
        title="SDPO vs GRPO, 2-digit then 1-digit addition",
    )  # fmt: skip
    by = {r["method"]: r for r in rows}
    g, sd = by["grpo"], by["sdpo"]
    write_result(
        a.out,
        name="llm_sdpo_continual",
        catalog_ids=["004-20"],
        config={**vars(a), "base": base},
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": "2-digit addition (stage 0's task) kept at the end of the sequence, "
            "SDPO vs GRPO (both from the same base)",
            "value": sd["add2_after_stage1"],
            "baseline": g["add2_after_stage1"],
            "ratio": sd["add2_after_stage1"] / g["add2_after_stage1"]
            if g["add2_after_stage1"]
            else None,
            "paper": "SDPO specialises faster in domain with a stable teacher, generalises "
            "worse out of distribution, forgets more than GRPO in continual post-training; "
            "denser self-distillation drifts further in parameter and response space",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
