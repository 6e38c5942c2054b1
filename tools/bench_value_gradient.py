"""The value-gradient view (catalog 000-11's study) along a pre-training trajectory of the
tiny model: does the criterion (value-gradient signal x reachable headroom) say where a
short RL run gains most?

The trajectory is the embedded base's own SFT (2-digit addition, same seed, schedule and
held-out exclusion), snapshotted at ``--snapshots`` steps (the embedded base stops at 950).
For each snapshot, ``rlpost-llm value-gradient``'s library call measures the signal, the
batch signal and the headroom on ``--prompts`` prompts x ``--samples`` samples; then GRPO
(the demo recipe) runs ``--steps`` steps from it per seed, and its gain is the greedy
held-out accuracy after minus before. Reported: the table, and the Spearman correlation
over snapshots between the realised gain and each predictor (criterion, signal, headroom,
the plain ``1 - mean reward``, and scale-free variants: the batch signal-to-noise ratio,
and the signal relative to the prompts' mean gradient norm, alone and times the headroom,
since Adam's steps do not grow with the gradient's norm). The paper proposes the
criterion; it reports no number.

    uv run --frozen python tools/bench_value_gradient.py --steps 60 --seeds 0 1 --threads 1
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from benchlib import mean_std, print_table, write_result
from llm_demo_runs import demo_args, train_demo

from rlpost.llm.config import load_config
from rlpost.llm.data.tasks import make_task
from rlpost.llm.model import tiny
from rlpost.llm.recipes import recipe_path
from rlpost.llm.tools.value_gradient import value_gradient

PREDICTORS = ("criterion", "signal", "batch_signal", "snr", "headroom", "room",
              "relative_signal", "relative_criterion")  # fmt: skip


def snapshots(steps: list[int], folder: Path) -> dict[int, Path]:
    """The embedded 2-digit base's SFT, rerun to ``max(steps)``, saved at each step."""
    tp, tr = tiny._resolve("arithmetic", {"digits": 2, "ops": "+"}, {})
    task = make_task("arithmetic", **tp)
    tok, model = tiny._new_base(task, tr)
    held = task.sample(tr["heldout"], random.Random(f"heldout-{tr['seed']}"))
    run = tiny._SFTRun(model, tok, task, tr["max_steps"], tr["batch_size"], tr["lr"],
                       rng_seed=tr["seed"], exclude_prompts=frozenset(e.prompt for e in held))  # fmt: skip
    out = {}
    for step in sorted(steps):
        run.train(step - run.step, progress=False)
        out[step] = folder / f"sft-{step}"
        model.save_pretrained(out[step], safe_serialization=True)
        tok.save_pretrained(out[step])
    return out


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = (torch.tensor(v).argsort().argsort().double() for v in (x, y))
    return float(torch.corrcoef(torch.stack([rx, ry]))[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    demo_args(ap, 60, 60, "bench_results/value_gradient.json")
    ap.add_argument("--snapshots", type=int, nargs="+",
                    default=[400, 600, 750, 850, 950, 1100, 1300, 1500])  # fmt: skip
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for step, folder in snapshots(a.snapshots, Path(tmp)).items():
            cfg = load_config(recipe_path("grpo_arithmetic"), [f"model.path={folder}"])
            (m,) = value_gradient([folder], cfg, Path(tmp) / f"vg-{step}", a.prompts, a.samples)
            runs = [train_demo(Path(tmp) / f"rl-{step}-{s}", s, a, [f"model.path={folder}"])[0]
                    for s in a.seeds]  # fmt: skip
            ev = [[r["eval/accuracy"] for r in rr if "eval/accuracy" in r] for rr in runs]
            gain = mean_std(e[-1] - e[0] for e in ev)
            rows.append({"sft_step": step, "heldout_before": ev[0][0], "mean_reward":
                         m["mean_reward"], "headroom": m["headroom"], "room": 1 - m["mean_reward"],
                         "signal": m["signal"], "batch_signal": m["batch_signal"],
                         "criterion": m["criterion"], "snr": m["snr"],
                         "relative_signal": m["signal"] / m["mean_prompt_norm"],
                         "relative_criterion": m["criterion"] / m["mean_prompt_norm"],
                         "rl_gain": gain[0], "rl_gain_std": gain[1]})  # fmt: skip
            print(f"  step {step}: {rows[-1]}", flush=True)
    print_table(rows, ["sft_step", "heldout_before", "mean_reward", "headroom", "signal",
                       "batch_signal", "snr", "relative_signal", "criterion", "rl_gain",
                       "rl_gain_std"])  # fmt: skip
    gains = [r["rl_gain"] for r in rows]
    corr = {p: spearman([r[p] for r in rows], gains) for p in PREDICTORS}
    print_table([{"predictor": p, "spearman_with_rl_gain": c} for p, c in corr.items()],
                ["predictor", "spearman_with_rl_gain"])  # fmt: skip
    write_result(
        a.out,
        name="value_gradient",
        catalog_ids=["000-11"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows + [{"predictor": p, "spearman_with_rl_gain": c} for p, c in corr.items()],
        headline={
            "metric": "Spearman correlation over pre-training snapshots between the criterion "
            "(signal x headroom) and a short GRPO run's held-out gain",
            "value": corr["criterion"],
            "baseline": corr["room"],  # (the plain "1 - mean reward" predictor)
            "ratio": corr["criterion"] / corr["room"] if corr["room"] else None,
            "paper": "RL impact decomposes into value-gradient signal and reachable reward "
            "headroom: a criterion for when RL is most effective along pre-training",
        },
    )
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
