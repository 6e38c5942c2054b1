"""Compiled decoder blocks (``torch.compile``) against eager, for the GRPO update on CPU.

Command (writes bench_results/compile.json)::

    uv run --frozen python tools/bench_compile.py --out docs/results/compile_<date>.json

Per workload (``--shapes``, ``new_tokens x rows``, 16-18-token prompts), three fresh
processes, one torch thread each: eager; compiled with an empty inductor cache (cold);
compiled again with that cache (warm: what a second run of the same shapes pays). Each
runs the trainer's update forward (``completion_logprobs``, padded layout, fused
log-probs) and backward ``--iters`` times on batches whose length varies by a few tokens,
as real batches do; each decoder layer is compiled with ``dynamic=True``. Reported: the
process's wall time to its first update and from start to end, the median CPU time of
the updates after the first, and the compiled gradients' largest difference from eager's
(relative to the largest gradient). The question it answers (issue 45): does compiling
win by default, i.e. over a short run too?
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import print_table, write_result


def child(mode: str, L: int, B: int, iters: int, out: str) -> None:
    t0 = time.perf_counter()
    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny
    from rlpost.llm.model.policy import completion_logprobs, make_seq_batch

    torch.set_num_threads(1)
    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny.tiny_config(tok, positions=2048))
    if mode != "eager":
        for layer in model.model.layers:
            layer.compile(dynamic=True)
    g = torch.Generator().manual_seed(1)
    cpu, first_wall, grad = [], None, None
    for i in range(iters):
        n = L - 3 * (i % 2)
        prompts = [[5 + (b % 7)] * (16 + b % 3) for b in range(B)]
        comp = torch.randint(3, 20, (B, n), generator=g)
        sb = make_seq_batch(prompts, comp, torch.ones(B, n), tok.pad_token_id)
        c = time.process_time()
        lp, ent = completion_logprobs(model, sb)
        (lp.sum() + 0.01 * ent.sum()).backward()
        cpu.append(time.process_time() - c)
        if i == 0:
            first_wall = time.perf_counter() - t0
            grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        model.zero_grad(set_to_none=True)
    torch.save(grad, out + ".grad")
    res = {"first_update_wall_s": first_wall, "update_cpu_s": statistics.median(cpu[1:])}
    res["process_wall_s"] = time.perf_counter() - t0
    Path(out).write_text(json.dumps(res))


def run(mode: str, L: int, B: int, iters: int, cache: str, tmp: Path) -> dict:
    out = str(tmp / f"{mode}-{L}-{B}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": cache}
    cmd = [sys.executable, __file__, "--_child", mode, str(L), str(B), str(iters), out]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return {**json.loads(Path(out).read_text()), "grad_file": out + ".grad"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["128x64", "512x16"])
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--out", default="bench_results/compile.json")
    ap.add_argument("--_child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        mode, L, B, iters, out = args._child
        return child(mode, int(L), int(B), int(iters), out)
    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_compile-") as tmp:
        for shape in args.shapes:
            L, B = (int(x) for x in shape.split("x"))
            cache = str(Path(tmp) / f"inductor-{shape}")
            res = {m: run(m.split("-")[0], L, B, args.iters, cache, Path(tmp))
                   for m in ("eager", "compiled-cold", "compiled-warm")}  # fmt: skip
            ref = torch.load(res["eager"]["grad_file"])
            for mode, r in res.items():
                diff = (torch.load(r["grad_file"]) - ref).abs().max() / ref.abs().max()
                rows.append({
                    "new_tokens": L, "rows": B, "mode": mode,
                    "first_update_wall_s": r["first_update_wall_s"],
                    "process_wall_s": r["process_wall_s"],
                    "update_cpu_s": r["update_cpu_s"],
                    "vs_eager": r["update_cpu_s"] / res["eager"]["update_cpu_s"],
                    "grad_rel_diff": float(diff),
                })  # fmt: skip
                print(rows[-1], flush=True)
    print_table(rows, list(rows[0]))
    best = min(rows, key=lambda r: r["vs_eager"])
    write_result(
        args.out,
        name="compile",
        catalog_ids=["base"],
        config=vars(args),
        seeds=[0],
        rows=rows,
        headline={
            "metric": "update CPU time, compiled decoder layers / eager (best shape)",
            "value": best["update_cpu_s"],
            "baseline": best["update_cpu_s"] / best["vs_eager"],
            "ratio": best["vs_eager"],
            "paper": None,
        },
    )


if __name__ == "__main__":
    main()
