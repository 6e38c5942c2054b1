"""Layer contribution (catalog 004-23) for the tiny model: each decoder layer trained alone
with RL, on the same budget as full RL, and its share of the full run's gain.

Per seed, ``rlpost-llm layers``' library call on the demo recipe (``grpo_arithmetic``,
``--steps`` steps of 32 prompts x 8 samples): the full model, then each of the tiny
model's 4 decoder layers alone (embeddings, other layers, final norm and head frozen).
Reported, mean and spread over seeds: held-out accuracy after, and the share of the full
run's gain. The seed study finds that training a single layer recovers most of full RL's
gain (sometimes more), with the high-contribution layers in the middle of the stack and
the layers near the input and output contributing less (seven Qwen models, three RL
algorithms).

    uv run --frozen python tools/bench_layers.py --steps 100 --seeds 0 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import mean_std, print_table, write_result

from rlpost.llm.recipes import recipe_path
from rlpost.llm.tools.layers import layer_contribution, plot_shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_results/layers.json")
    ap.add_argument("--plot", default="docs/img/layers.png")
    a = ap.parse_args()
    t0 = time.perf_counter()
    per_seed = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.seeds:
            over = [f"train.steps={a.steps}", f"run.seed={s}", f"run.threads={a.threads}",
                    "run.save_every=0", "run.progress=false", "run.tensorboard=false"]  # fmt: skip
            per_seed.append(
                layer_contribution(recipe_path("grpo_arithmetic"), over, Path(tmp) / f"{s}")
            )
    rows = []
    for i, name in enumerate(r["run"] for r in per_seed[0]):
        after = mean_std(rs[i]["heldout_after"] for rs in per_seed)
        shares = [rs[i]["share_of_full_gain"] for rs in per_seed]
        share = mean_std(shares) if None not in shares else (float("nan"), 0.0)
        rows.append({"run": name, "heldout_before": per_seed[0][i]["heldout_before"],
                     "heldout_after": after[0], "heldout_after_std": after[1],
                     "share_of_full_gain": share[0], "share_std": share[1]})  # fmt: skip
    print_table(rows, ["run", "heldout_before", "heldout_after", "heldout_after_std",
                       "share_of_full_gain", "share_std"])  # fmt: skip
    plot_shares([{**r} for r in rows], Path(a.plot))
    best = max(rows[1:], key=lambda r: r["share_of_full_gain"])
    write_result(
        a.out,
        name="layers",
        catalog_ids=["004-23"],
        config=vars(a),
        seeds=a.seeds,
        rows=rows,
        headline={
            "metric": f"the best single layer's share of full RL's gain ({best['run']})",
            "value": best["share_of_full_gain"],
            "baseline": 1.0,
            "ratio": best["share_of_full_gain"],
            "paper": "a single layer recovers most of full RL's gain; the middle layers "
            "contribute most",
        },
    )
    print(f"wrote {a.out} and {a.plot} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
