"""Fused linear log-prob / entropy vs the naive ``log_softmax`` over materialised logits:
peak memory and time of forward + backward on CPU (each variant in its own process, so
peak RSS is its own).

Command (defaults = the issue's size; writes bench_results/kernels.json)::

    uv run --frozen python tools/bench_kernels.py --tokens 8192 --vocab 151936 --hidden 1024

Both variants get the same float32 inputs (seed 0), compute ``logp`` and ``entropy`` of
every token and back-propagate ``sum(logp) + 0.1 sum(entropy)`` into ``hidden`` and
``weight``. ``fused`` is ``rlpost.kernels.ops.linear_logprob`` (the chunked torch
reference on CPU, ``--chunk`` vocabulary columns at a time); ``naive`` builds the
``[N, V]`` float32 logits and calls ``log_softmax``. Peak memory is the process's peak
resident set (VmHWM) minus its resident set after the inputs were made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import print_table, proc_status_mib, write_result


def one(variant: str, n: int, v: int, d: int, chunk: int, threads: int) -> dict:
    import torch

    from rlpost.kernels.ops.linear_logprob import (
        linear_logprob_entropy,
        linear_logprob_entropy_naive,
    )

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = (0.02 * torch.randn(v, d, generator=g)).requires_grad_()
    y = torch.randint(v, (n,), generator=g)
    base = proc_status_mib("VmRSS")
    t0 = time.perf_counter()
    if variant == "fused":
        lp, ent = linear_logprob_entropy(h, w, y, backend="reference", chunk=chunk)
    else:
        lp, ent = linear_logprob_entropy_naive(h, w, y)
    t1 = time.perf_counter()
    (lp.sum() + 0.1 * ent.sum()).backward()
    t2 = time.perf_counter()
    return {
        "variant": variant,
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "total_s": t2 - t0,
        "peak_extra_mib": proc_status_mib("VmHWM") - base,
        "logp_sum": float(lp.sum()),
        "entropy_mean": float(ent.mean()),
        "grad_h_norm": float(h.grad.norm()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["fused", "naive"])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench_results/kernels.json")
    args = ap.parse_args()
    if args.one:  # child process
        r = one(args.one, args.tokens, args.vocab, args.hidden, args.chunk, args.threads)
        print(json.dumps(r))
        return
    rows = []
    for variant in args.variants:
        cmd = [sys.executable, __file__, "--one", variant, "--tokens", str(args.tokens)]
        cmd += ["--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        cmd += ["--chunk", str(args.chunk), "--threads", str(args.threads)]
        print(f"running {variant} ...", flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"  {variant} failed (rc {out.returncode}): {out.stderr[-400:]}")
            rows.append({"variant": variant, "error": f"rc {out.returncode}"})
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\nN={args.tokens} tokens, V={args.vocab}, D={args.hidden}, float32, CPU")
    cols = ["variant", "forward_s", "backward_s", "total_s", "peak_extra_mib"]
    cols += ["logp_sum", "entropy_mean", "grad_h_norm"]
    print_table(rows, cols)
    by = {r["variant"]: r for r in rows if "error" not in r}
    headline = {
        "metric": "peak extra memory of forward + backward (MiB), fused vs naive",
        "value": by.get("fused", {}).get("peak_extra_mib"),
        "baseline": by.get("naive", {}).get("peak_extra_mib"),
        "ratio": None,
        "paper": None,
    }
    if headline["value"] and headline["baseline"]:
        headline["ratio"] = headline["baseline"] / headline["value"]
    out = write_result(
        args.out,
        name="kernels",
        catalog_ids=[],
        config=vars(args),
        seeds=[0],
        rows=rows,
        headline=headline,
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
