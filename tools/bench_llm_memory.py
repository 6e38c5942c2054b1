"""Peak memory of a GRPO run against response length and group size (issue 18).

Command (defaults; writes bench_results/llm_memory.json)::

    uv run --frozen python tools/bench_llm_memory.py --lengths 8 32 64 --groups 4 8 16 \\
        --prompts 8 --steps 4 --out bench_results/llm_memory.json

Each cell is one fresh rlpost training process on the benchmark's workload
(``tools/bench_llm_grpo.py``'s child: the same saved tiny Qwen2, arithmetic prompts, GRPO
with its defaults, 1 torch thread), ``--steps`` timed steps after one warm-up. Reported:

* peak RSS: the process's ``VmHWM`` at the end of the last step (imports, model,
  optimizer and the training loop included);
* loop growth: that peak minus the resident set just before ``train()``, i.e. what
  rollouts, activations and the update add at their largest;
* step ms, for scale.

Growth *across* steps (a leak) is a test: ``test_trainer.py::
test_memory_does_not_grow_across_steps``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from bench_llm_grpo import make_prompts, run_child, save_model, summarise


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_results/llm_memory.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_llm_memory-") as tmp:
        model_dir = Path(tmp) / "model"
        n_params = save_model(model_dir, "default", 0)
        for L in args.lengths:
            for G in args.groups:
                spec = {
                    "model": str(model_dir),
                    "data": make_prompts(args.prompts * (args.steps + 1), args.seed),
                    "seed": args.seed,
                    "prompts": args.prompts,
                    "group_size": G,
                    "max_new_tokens": L,
                    "temperature": 1.0,
                    "lr": 1e-4,
                    "steps": args.steps,
                    "warmup": 1,
                    "threads": 1,
                    "mask_truncated": False,
                }
                work = Path(tmp) / f"L{L}-G{G}"
                work.mkdir()
                spec["work"] = str(work)
                r = summarise(run_child(sys.executable, "rlpost", spec, work, False), spec)
                row = {
                    "max_new_tokens": L,
                    "group_size": G,
                    "completions": args.prompts * G,
                    "gen_tokens_per_step": r["gen_tokens_per_step"],
                    "peak_rss_mib": r["peak_rss_mib"],
                    "loop_growth_mib": r["rss_growth_mib"],
                    "step_ms": r["step_ms"],
                }
                rows.append(row)
                print(
                    f"L={L:3d} G={G:3d}: peak {row['peak_rss_mib']:.0f} MiB, loop +"
                    f"{row['loop_growth_mib']:.0f} MiB, {row['step_ms']:.0f} ms/step",
                    flush=True,
                )
    print(f"\nGRPO peak memory, tiny Qwen2 ({n_params:,} params), P={args.prompts} prompts")
    benchlib.print_table(
        rows,
        [
            ("max_new_tokens", "max new tokens"),
            ("group_size", "G"),
            ("completions", "completions"),
            ("gen_tokens_per_step", "gen tok/step"),
            ("peak_rss_mib", "peak RSS MiB"),
            ("loop_growth_mib", "loop growth MiB"),
            ("step_ms", "step ms"),
        ],
    )
    biggest = max(rows, key=lambda r: r["peak_rss_mib"])
    out = benchlib.write_result(
        args.out,
        name="llm_memory",
        catalog_ids=["base"],
        config={
            "prompts_per_step": args.prompts,
            "lengths": args.lengths,
            "groups": args.groups,
            "steps": args.steps,
            "model_params": n_params,
            "threads": 1,
            "peak_rss": "VmHWM at the end of the last step, fresh process per cell",
        },
        seeds=[args.seed],
        rows=rows,
        headline={
            "metric": "peak RSS MiB at the largest cell",
            "value": biggest["peak_rss_mib"],
            "baseline": None,
            "ratio": None,
            "paper": None,
        },
    )
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
