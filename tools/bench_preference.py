"""Preference-loss benchmark: the six PREFERENCE_LOSSES entries on the same pairs.

Command (defaults; writes bench_results/preference.json)::

    uv run --frozen python tools/bench_preference.py --steps 200 --seeds 0 1 \\
        --out bench_results/preference.json

Every run is the shipped ``dpo_arithmetic`` recipe (offline, the embedded tiny model
``model.path=tiny`` on 2-digit addition, lr 3e-5, 64 pairs per step) with ``loss.name``
set to the entry and its parameters taken from the recipe's ``loss.per_loss``, for
``--steps`` steps, one torch thread. For a seed ``s`` every loss sees the same training
pairs in the same order and the same held-out set (``data.seed = run.seed = s``) and starts
from the same weights, so the "before" columns agree across losses. Measured on the 256
held-out pairs / prompts before and after training:

* ``margin``: mean ``log pi(y_w) - log pi(y_l)`` (nats; the same quantity for every loss,
  unlike the losses' implicit rewards);
* ``pref_acc``: fraction of pairs with ``log pi(y_w) > log pi(y_l)``;
* ``greedy_acc``: greedy task accuracy (the task's verifier).

Rows give mean and sample std over the seeds; the headline compares the loss with the
best final greedy accuracy with DPO.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from benchlib import mean_std, print_table, write_result

from rlpost.core.preference import PREFERENCE_LOSSES
from rlpost.llm.model.policy import load_policy
from rlpost.llm.preference import PreferenceTrainer, load_preference_config
from rlpost.llm.recipes import recipe_path

CATALOG = {"xi_dpo": "001-06", "gate_dpo": "001-20", "ed_dpo": "001-04"}
METRICS = {"margin": "margin", "pref_acc": "pref_acc", "greedy_acc": "eval"}


def run_one(loss: str, seed: int, steps: int, root: Path, base) -> dict:
    cfg = load_preference_config(
        recipe_path("dpo_arithmetic"),
        [
            f"loss.name={loss}",
            f"train.steps={steps}",
            f"data.seed={seed}",
            f"run.seed={seed}",
            f"run.eval_every={steps}",
            "run.save_every=0",
            "run.threads=1",
            "run.progress=false",
            "run.tensorboard=false",
            "reward.workers=0",
            f"run.dir={root / f'{loss}-seed{seed}'}",
        ],
    )
    model, tok = base
    t0 = time.perf_counter()
    res = PreferenceTrainer(cfg, copy.deepcopy(model), tok).train()
    out = {"loss": loss, "seed": seed, "seconds": time.perf_counter() - t0}
    out["params"] = cfg.loss.resolved_params()
    for key, name in METRICS.items():
        out[f"{key}_before"], out[f"{key}_after"] = res[f"{name}_before"], res[f"{name}_after"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--losses", nargs="+", default=PREFERENCE_LOSSES.names())
    ap.add_argument("--out", default="bench_results/preference.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base_cfg = load_preference_config(recipe_path("dpo_arithmetic"), ["run.progress=false"])
    base = load_policy(base_cfg, progress=False)  # built once (cached), copied per run
    runs: list[dict] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_preference_") as tmp:
        for seed in args.seeds:
            for loss in args.losses:
                r = run_one(loss, seed, args.steps, Path(tmp), base)
                runs.append(r)
                print(
                    f"  {loss:<9} seed {seed}: greedy {r['greedy_acc_before']:.3f} -> "
                    f"{r['greedy_acc_after']:.3f}, margin {r['margin_before']:.2f} -> "
                    f"{r['margin_after']:.2f}, pref acc {r['pref_acc_before']:.3f} -> "
                    f"{r['pref_acc_after']:.3f} ({r['seconds']:.0f} s)",
                    flush=True,
                )
    rows = []
    for loss in args.losses:
        mine = [r for r in runs if r["loss"] == loss]
        row: dict = {"loss": loss, "params": mine[0]["params"]}
        for key in METRICS:
            for when in ("before", "after"):
                m, s = mean_std(r[f"{key}_{when}"] for r in mine)
                row[f"{key}_{when}"], row[f"{key}_{when}_std"] = m, s
        row["seconds"] = mean_std(r["seconds"] for r in mine)[0]
        row["per_seed"] = [{k: v for k, v in r.items() if k != "params"} for r in mine]
        rows.append(row)
    table = [
        {
            "loss": r["loss"],
            "margin": f"{r['margin_before']:.2f} -> {r['margin_after']:.2f} ± {r['margin_after_std']:.2f}",
            "pref acc": f"{r['pref_acc_before']:.3f} -> {r['pref_acc_after']:.3f} ± {r['pref_acc_after_std']:.3f}",
            "greedy acc": f"{r['greedy_acc_before']:.3f} -> {r['greedy_acc_after']:.3f} ± {r['greedy_acc_after_std']:.3f}",
            "s/run": r["seconds"],
        }
        for r in rows
    ]
    print(
        f"\n{len(args.losses)} losses x seeds {args.seeds}, {args.steps} steps each "
        f"(held-out, before -> after, mean ± std over seeds; {time.perf_counter() - t_all:.0f} s):"
    )
    print_table(table, ["loss", "margin", "pref acc", "greedy acc", "s/run"])
    best = max(rows, key=lambda r: r["greedy_acc_after"])
    dpo = next((r for r in rows if r["loss"] == "dpo"), best)
    path = write_result(
        args.out,
        name="preference",
        catalog_ids=[CATALOG[n] for n in args.losses if n in CATALOG],
        config={
            "recipe": "dpo_arithmetic",
            "steps": args.steps,
            "losses": args.losses,
            "model": base_cfg.model.path,
            "pairs_per_step": base_cfg.train.batch_size,
            "lr": base_cfg.optim.lr,
            "train_pairs": base_cfg.data.train_size,
            "eval_size": base_cfg.data.eval_size,
            "torch_threads": 1,
        },
        seeds=args.seeds,
        rows=rows,
        headline={
            "metric": f"held-out greedy accuracy after {args.steps} steps ({best['loss']} vs dpo)",
            "value": best["greedy_acc_after"],
            "baseline": dpo["greedy_acc_after"],
            "ratio": best["greedy_acc_after"] / max(dpo["greedy_acc_after"], 1e-12),
            "paper": None,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
