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

A ``--losses`` item may set parameters of its entry: ``ed_dpo@alpha=0.02`` runs ED-DPO
with ``loss.per_loss.ed_dpo.alpha=0.02`` and is reported under that label.

Before training, each seed's (and ``--xi-seeds``') initial model is scored on its training
pairs: the quantiles of xi-DPO's per-token ratio margin ``rho_0`` (median, and the 0.9
quantile that ``xi_from_initial`` returns, which the recipe's ``xi`` is, and the 0.1
quantile) go to the JSON's ``headline.initial_ratio_margins``. They are clipped into
``(1e-9, 1 - 1e-9)`` as ``xi_from_initial`` clips: a ``q10`` of ``1e-9`` says that at
least 10 % of the pairs start with ``rho_0 <= 0`` (the rejected answer likelier per token).

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

from rlpost.core.preference import PREFERENCE_LOSSES, xi_from_initial
from rlpost.llm.model.policy import load_policy
from rlpost.llm.preference import PreferenceTrainer, load_preference_config
from rlpost.llm.recipes import recipe_path

CATALOG = {"xi_dpo": "001-06", "gate_dpo": "001-20", "ed_dpo": "001-04"}
METRICS = {"margin": "margin", "pref_acc": "pref_acc", "greedy_acc": "eval"}


def parse_variant(label: str) -> tuple[str, list[str]]:
    """``"ed_dpo@alpha=0.02,beta=0.5"`` -> ``("ed_dpo", ["loss.per_loss.ed_dpo.alpha=0.02",
    ...])``; a bare name has no overrides."""
    loss, _, sets = label.partition("@")
    if loss not in PREFERENCE_LOSSES.names():
        raise SystemExit(f"unknown loss {loss!r} in {label!r}; one of {PREFERENCE_LOSSES.names()}")
    return loss, [f"loss.per_loss.{loss}.{kv}" for kv in sets.split(",") if kv]


def _config(label: str, seed: int, steps: int, root: Path):
    loss, sets = parse_variant(label)
    return load_preference_config(
        recipe_path("dpo_arithmetic"),
        [
            f"loss.name={loss}",
            *sets,
            f"train.steps={steps}",
            f"data.seed={seed}",
            f"run.seed={seed}",
            f"run.eval_every={steps}",
            "run.save_every=0",
            "run.threads=1",
            "run.progress=false",
            "run.tensorboard=false",
            "reward.workers=0",
            f"run.dir={root / f'{label}-seed{seed}'}",
        ],
    )


def initial_ratio_margins(seed: int, root: Path, base) -> dict:
    """Quantiles of xi-DPO's ``rho_0`` of the initial model on seed ``seed``'s training pairs."""
    model, tok = base
    # (a loss without a reference or an ``auto`` parameter: the trainer only scores here)
    trainer = PreferenceTrainer(_config("simpo", seed, 1, root / "initial"), model, tok)
    # the trainer's own scoring of all pairs (no grad, eval mode, its micro-batches)
    cw, cl, nw, nl = trainer.all_logprobs(model, trainer.train_pairs)
    trainer.close()
    q = {
        f"q{int(p * 100)}": xi_from_initial(cw, cl, nw, nl, p, (1e-9, 1 - 1e-9))
        for p in (0.1, 0.5, 0.9)
    }
    return {"seed": seed, "pairs": len(cw), **q, "xi_from_initial": xi_from_initial(cw, cl, nw, nl)}


def run_one(label: str, seed: int, steps: int, root: Path, base) -> dict:
    cfg = _config(label, seed, steps, root)
    model, tok = base
    t0 = time.perf_counter()
    res = PreferenceTrainer(cfg, copy.deepcopy(model), tok).train()
    out = {"loss": label, "seed": seed, "seconds": time.perf_counter() - t0}
    params = cfg.loss.resolved_params()  # (an ``auto`` one as the value the run set)
    out["params"] = {k: res[k] if v == "auto" else v for k, v in params.items()}
    for key, name in METRICS.items():
        out[f"{key}_before"], out[f"{key}_after"] = res[f"{name}_before"], res[f"{name}_after"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--losses",
        nargs="+",
        default=PREFERENCE_LOSSES.names(),
        help="entries, each optionally with parameters: ed_dpo@alpha=0.02",
    )
    ap.add_argument(
        "--xi-seeds",
        type=int,
        nargs="*",
        default=[7],
        help="more data seeds whose initial ratio margins are recorded (the recipe's tuning seed)",
    )
    ap.add_argument("--out", default="bench_results/preference.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base_cfg = load_preference_config(recipe_path("dpo_arithmetic"), ["run.progress=false"])
    base = load_policy(base_cfg, progress=False)  # built once (cached), copied per run
    runs: list[dict] = []
    t_all = time.perf_counter()
    for label in args.losses:
        parse_variant(label)  # a bad name fails before anything runs
    margins: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_preference_") as tmp:
        for seed in dict.fromkeys([*args.seeds, *args.xi_seeds]):
            margins.append(initial_ratio_margins(seed, Path(tmp), base))
            m = margins[-1]
            print(
                f"  initial rho_0, seed {seed} ({m['pairs']} pairs): median {m['q50']:.3f}, "
                f"0.9 quantile {m['q90']:.3f}",
                flush=True,
            )
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
            "initial_ratio_margins": margins,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
