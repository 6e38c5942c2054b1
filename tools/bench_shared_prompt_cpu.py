"""The shared-prompt attention op's CPU backends, forward + backward: ``split`` (two flash
attentions merged by log-sum-exp, the prompt's keys and values never copied) against
``sdpa`` (one masked SDPA call over per-response copies of the prompt's keys and values).

Command (defaults; writes bench_results/shared_prompt_cpu.json)::

    uv run --frozen python tools/bench_shared_prompt_cpu.py

Per shape ``N x (P + R)``, heads 4 of width 32 (the tiny model's): the two backends take
turns ``--repeats`` times (each turn the median of three calls after an untimed one) on
the same float32 inputs, and ``split_speedup`` is the median of the per-turn ratios
sdpa / split. ``auto_takes_split``: whether ``backend="auto"`` takes the split on CPU
(``split.preferred``: a prompt of at least 128 tokens and twice a response's length).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import in_turns, print_table, write_result

SHAPES = [(4, 256, 64), (8, 256, 64), (16, 256, 64), (16, 1024, 128), (8, 512, 128),
          (16, 192, 64), (8, 128, 64), (8, 256, 128), (8, 64, 64), (8, 64, 16), (8, 32, 8),
          (8, 8, 128), (16, 64, 512), (8, 9, 1)]  # fmt: skip


def call(fn, ins) -> None:
    """One forward + backward of ``fn`` on ``ins``."""
    for x in ins:
        x.grad = None
    out_p, out_r = fn(*ins)
    (out_p.sum() + out_r.square().sum()).backward()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench_results/shared_prompt_cpu.json")
    args = ap.parse_args()

    import torch

    from rlpost.kernels.ops.shared_prompt import shared_prompt_attention, split

    torch.set_num_threads(args.threads)
    H, d = 4, 32
    rows = []
    for N, P, R in SHAPES:
        g = torch.Generator().manual_seed(P + R)
        ins = [torch.randn(H, P, d, generator=g).requires_grad_() for _ in range(3)]
        ins += [torch.randn(N, H, R, d, generator=g).requires_grad_() for _ in range(3)]
        backends = {
            b: (lambda *x, b=b: shared_prompt_attention(*x, backend=b)) for b in ("split", "sdpa")
        }
        times = in_turns(list(backends), args.repeats, lambda b, f=backends, x=ins: call(f[b], x))
        ratio = [a / b for a, b in zip(times["sdpa"], times["split"], strict=True)]
        rows.append(
            {
                "N": N,
                "P": P,
                "R": R,
                "sdpa_ms": 1e3 * statistics.median(times["sdpa"]),
                "split_ms": 1e3 * statistics.median(times["split"]),
                "split_speedup": statistics.median(ratio),
                "auto_takes_split": split.preferred(P, R),
            }
        )
        print(f"  N={N} P={P} R={R}: split {rows[-1]['split_speedup']:.2f}x", flush=True)
    print(f"\nshared-prompt attention on CPU, fwd + bwd, H={H} d={d}, {args.threads} thread(s)")
    print_table(rows, list(rows[0]))
    taken = [r["split_speedup"] for r in rows if r["auto_takes_split"]]
    write_result(
        args.out,
        name="shared_prompt_cpu",
        catalog_ids=["000-21"],
        config=vars(args),
        seeds=[0],
        rows=rows,
        headline={
            "metric": "split / sdpa speed-up of the op, smallest where auto takes the split",
            "value": min(taken),
            "baseline": 1.0,
            "ratio": min(taken),
            "paper": None,
        },
    )


if __name__ == "__main__":
    main()
