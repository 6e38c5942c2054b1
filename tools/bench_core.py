"""rlpost-core benchmark: per-step loss math time, and log-prob+entropy peak memory (CPU).

Command (defaults; writes bench_results/core.json)::

    uv run --frozen python tools/bench_core.py --batch 512 --tokens 2048 --vocab 151936 \\
        --mem-tokens 2048 --repeats 3 --seeds 0 1 2 --out bench_results/core.json

Quick run::

    uv run --frozen python tools/bench_core.py --batch 64 --tokens 256 --vocab 32000 \\
        --mem-tokens 512 --repeats 1 --seeds 0

What it measures, on CPU with torch's default thread count:

(a) Step math per preset (grpo, dapo, dr_grpo, gspo, rloo, reinforce_pp, ppo) on
    ``batch`` responses x ``tokens`` tokens, right-padded to random lengths drawn
    uniformly from [1, tokens], in groups of 8 (``group_ids = arange(batch) // 8``),
    binary rewards: advantages (``ppo`` gets critic values; presets with the KL in the
    reward get ``kl_reward_penalty`` token rewards, computed inside the timed region;
    presets with the KL in the loss get ``ref_logp``), ``Recipe.policy_loss`` forward,
    and backward to ``logp`` (a leaf). One warm-up step per preset and seed, then
    ``repeats`` timed steps; mean and std over repeats x seeds. tokens/s counts the
    padded ``batch * tokens`` positions (the tensors every step walks). Unless
    ``--default-malloc``, glibc is told to keep freed memory (see ``keep_freed_memory``)
    so that the times are the math's, not the page faults of fresh allocations.
(b) Peak memory of log-probs AND entropy of bf16 logits ``[mem_tokens, vocab]`` plus the
    backward of ``logp.sum() + entropy.sum()``: the chunked ``logprobs_and_entropy``
    (each ``--chunk-sizes`` value; the first is the headline) vs a naive reference
    (``lp = logits.float().log_softmax(-1)``, gather, ``-(lp.exp() * lp).sum(-1)``).
    Each variant and seed runs in its own fresh subprocess (this script with the hidden
    ``--_mem-child`` flag); peak = growth of the peak RSS over its value right after the
    logits are allocated (so the logits are in the baseline, their bf16 ``.grad`` is in
    the peak), over ``repeats`` runs (no full-size warm-up), plus the wall time of each
    fwd+bwd, which includes the page faults of fresh allocations. The peak RSS is
    ``VmHWM`` on Linux, because a child's ``ru_maxrss`` starts at the parent's peak
    (see ``_peak_rss_mib``); ``ru_maxrss`` elsewhere; the ``ru_maxrss`` growth is
    recorded too. The children run with
    ``MALLOC_MMAP_THRESHOLD_=1048576`` (see ``MMAP_THRESHOLD``) so that RSS follows the
    live tensors. A small case checked in this process gives the max abs difference of
    the chunked outputs and gradients from the naive ones.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from benchlib import proc_status_mib as _proc_status_mib
from tqdm import tqdm

from rlpost.core import (
    AdvantageInput,
    Input,
    PolicyBatch,
    get_preset,
    kl_reward_penalty,
    logprobs_and_entropy,
)

sys.path.insert(0, str(Path(__file__).parent))
import benchlib

PRESET_NAMES = ("grpo", "dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp", "ppo")
GROUP_SIZE = 8
MIB = 1024.0 * 1024.0
# glibc serves frees of heap blocks below its (dynamic, up to 32 MiB) mmap threshold by
# keeping the pages, so RSS then depends on allocation order, not on live tensors. The
# memory children fix the threshold at 1 MiB: every tensor >= 1 MiB is its own mapping,
# returned to the OS when freed. (At the default sizes every big tensor is > 32 MiB
# anyway.) An MALLOC_MMAP_THRESHOLD_ already in the environment is kept.
MMAP_THRESHOLD = 1 << 20


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse, as a caching allocator would (for (a)).

    With the defaults, each 4 MiB ``[B, T]`` float tensor is a fresh mapping (or the heap
    is trimmed after the free), so every step pays page faults for all of its
    temporaries; on a VM these dominate the step math and make the timings noisy.
    Returns a description of the setting in force.
    """
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(m_mmap_threshold, 32 << 20) == 1  # glibc's maximum, 32 MiB
        ok = ok and libc.mallopt(m_trim_threshold, 1 << 30) == 1
    except (OSError, AttributeError):
        ok = False
    return "mallopt(M_MMAP_THRESHOLD=32 MiB, M_TRIM_THRESHOLD=1 GiB)" if ok else "default"


# ----------------------------------------------------------------------------- (a) step time


def make_batch(batch: int, tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """Synthetic rollout batch: right-padded mask, log-probs, rewards, values."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, tokens + 1, (batch,), generator=g)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    logp = -(torch.randn(batch, tokens, generator=g).abs() * 1.5)
    return {
        "mask": mask,
        "logp": logp,
        "old_logp": logp + 0.05 * torch.randn(batch, tokens, generator=g),
        "ref_logp": logp + 0.1 * torch.randn(batch, tokens, generator=g),
        "values": 0.5 * torch.randn(batch, tokens, generator=g),
        "rewards": torch.bernoulli(torch.full((batch,), 0.5), generator=g),
        "group_ids": torch.arange(batch) // GROUP_SIZE,
    }


def kl_placement(preset) -> str:
    """'loss', 'reward' or 'none': where the preset's KL penalty goes."""
    if preset.kl is None or preset.kl_coef <= 0:
        return "none"
    return "reward" if preset.kl_in_reward else "loss"


def step(recipe, d: dict[str, torch.Tensor]) -> tuple[float, float, float]:
    """One step's math; returns seconds for (advantages, loss forward, backward)."""
    p = recipe.preset
    kl_where = kl_placement(p)
    logp = d["logp"].clone().requires_grad_(True)  # leaf, as the model's output would be
    t0 = time.perf_counter()
    token_rewards = None
    if kl_where == "reward":
        token_rewards = kl_reward_penalty(
            logp.detach(), d["ref_logp"], d["mask"], beta=p.kl_coef, estimator=p.kl.name
        )
    values = d["values"] if Input.VALUES in recipe.advantage.reads else None
    adv = recipe.advantages(
        AdvantageInput(
            d["rewards"], d["group_ids"], d["mask"], values=values, token_rewards=token_rewards
        )
    ).advantages
    t1 = time.perf_counter()
    out = recipe.policy_loss(
        PolicyBatch(
            logp,
            d["old_logp"],
            adv,
            d["mask"],
            # (the recipe's contract asks for it wherever the KL is on, as the trainer passes it)
            ref_logp=d["ref_logp"] if kl_where != "none" else None,
            generation_budget=float(d["mask"].shape[1]),
        )
    )
    t2 = time.perf_counter()
    out.loss.backward()
    t3 = time.perf_counter()
    if not (torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()):
        raise FloatingPointError(f"{p.name}: non-finite loss or gradient")
    return t1 - t0, t2 - t1, t3 - t2


def bench_steps(args) -> list[dict]:
    """Time every preset's step math; one row per preset."""
    samples: dict[str, list[tuple[float, float, float]]] = {n: [] for n in PRESET_NAMES}
    valid_frac = []
    bar = tqdm(
        total=len(args.seeds) * len(PRESET_NAMES) * (1 + args.repeats),
        desc="step timing",
        file=sys.stderr,
    )
    for seed in args.seeds:
        d = make_batch(args.batch, args.tokens, seed)
        valid_frac.append(d["mask"].mean().item())
        for name in PRESET_NAMES:
            recipe = get_preset(name).build()
            bar.set_postfix(seed=seed, preset=name)
            for i in range(1 + args.repeats):
                t = step(recipe, d)
                if i > 0:  # the first is the warm-up
                    samples[name].append(t)
                bar.update()
    bar.close()
    bt = args.batch * args.tokens
    rows = []
    for name in PRESET_NAMES:
        p = get_preset(name)
        s = samples[name]
        total = [sum(t) * 1e3 for t in s]
        row = {
            "section": "step_time",
            "preset": name,
            "advantage": p.advantage.name,
            "kl": kl_placement(p),
            "batch": args.batch,
            "tokens": args.tokens,
            "valid_frac": benchlib.mean_std(valid_frac)[0],
            "n": len(s),
        }
        for key, vals in (
            ("adv_ms", [t[0] * 1e3 for t in s]),
            ("fwd_ms", [t[1] * 1e3 for t in s]),
            ("bwd_ms", [t[2] * 1e3 for t in s]),
            ("ms", total),
            ("tokens_per_s", [bt / (ms / 1e3) for ms in total]),
        ):
            row[f"{key}_mean"], row[f"{key}_std"] = benchlib.mean_std(vals)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- (b) memory


def logprob_entropy(variant: str, logits: torch.Tensor, targets: torch.Tensor, chunk: int):
    """(logp, entropy) of the rows of ``logits`` by the chunked or the naive method."""
    if variant == "chunked":
        return logprobs_and_entropy(logits, targets, chunk_size=chunk)
    lp = logits.float().log_softmax(-1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


def _maxrss_mib() -> float:
    """Peak RSS of this process so far (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / MIB if sys.platform == "darwin" else rss / 1024.0


def _peak_rss_mib() -> float:
    """Peak RSS of this process image: ``VmHWM`` on Linux, else ``ru_maxrss``.

    ``ru_maxrss`` is not reset by exec: a child's value starts at the *parent's* peak RSS
    (Linux records the old address space's high-water mark at exec), so after the parent
    has grown, a child's ``ru_maxrss`` stays flat and its growth reads 0. ``VmHWM``
    belongs to the new address space and starts from zero.
    """
    hwm = _proc_status_mib("VmHWM")
    return _maxrss_mib() if hwm is None else hwm


def mem_child(args) -> None:
    """Runs in a fresh process: print one JSON line with the peak RSS growth and times."""
    variant, chunk = args.mem_child, args.chunk_sizes[0]
    n, v = args.mem_tokens, args.vocab
    torch.manual_seed(args.mem_seed)
    small = torch.randn(16, 64, dtype=torch.bfloat16, requires_grad=True)  # init kernels
    sum(logprob_entropy(variant, small, torch.randint(64, (16,)), 8)).sum().backward()
    logits = torch.empty(n, v, dtype=torch.bfloat16)
    for s in range(0, n, 128):  # fill in pieces: no full-size float32 temporary
        logits[s : s + 128].normal_(0.0, 2.0)
    logits.requires_grad_(True)
    targets = torch.randint(v, (n,))
    base, base_maxrss, base_rss = _peak_rss_mib(), _maxrss_mib(), _proc_status_mib("VmRSS")
    times = []
    for _ in range(args.repeats):  # no full-size warm-up: kernels were initialised above
        logits.grad = None
        t0 = time.perf_counter()
        logp, ent = logprob_entropy(variant, logits, targets, chunk)
        (logp.sum() + ent.sum()).backward()
        times.append(time.perf_counter() - t0)
        del logp, ent
    peak, maxrss = _peak_rss_mib(), _maxrss_mib()
    out = {
        "peak_growth_mib": peak - base,
        "baseline_peak_mib": base,
        "baseline_rss_mib": base_rss,
        # ru_maxrss growth, valid only when its baseline is this process's own (see above)
        "ru_maxrss_growth_mib": maxrss - base_maxrss,
        "ru_maxrss_baseline_mib": base_maxrss,
        "logits_mib": logits.numel() * logits.element_size() / MIB,
        "times_s": times,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(out), flush=True)


def run_mem_child(args, variant: str, chunk: int, seed: int) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_mem-child",
        variant,
        "--_mem-seed",
        str(seed),
        "--mem-tokens",
        str(args.mem_tokens),
        "--vocab",
        str(args.vocab),
        "--repeats",
        str(args.repeats),
        "--chunk-sizes",
        str(chunk),
    ]
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise RuntimeError(f"memory child {variant} (seed {seed}) failed: rc {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_agreement(chunk: int, vocab: int, seed: int = 0) -> dict[str, float]:
    """Max abs difference chunked vs naive (logp, entropy, bf16 grad) on a small case."""
    n, v = 2 * chunk + 37, min(vocab, 4096)  # several chunks, the last one partial
    g = torch.Generator().manual_seed(seed)
    base = (2.0 * torch.randn(n, v, generator=g)).to(torch.bfloat16)
    targets = torch.randint(v, (n,), generator=g)
    res = {}
    for variant in ("naive", "chunked"):
        logits = base.clone().requires_grad_(True)
        logp, ent = logprob_entropy(variant, logits, targets, chunk)
        (logp.sum() + ent.sum()).backward()
        res[variant] = (logp.detach(), ent.detach(), logits.grad.float())
    return {
        "check_shape": [n, v],
        "max_abs_diff_logp": (res["naive"][0] - res["chunked"][0]).abs().max().item(),
        "max_abs_diff_entropy": (res["naive"][1] - res["chunked"][1]).abs().max().item(),
        "max_abs_diff_grad": (res["naive"][2] - res["chunked"][2]).abs().max().item(),
        "max_abs_grad": res["naive"][2].abs().max().item(),
    }


def bench_memory(args) -> list[dict]:
    """Peak RSS growth of each variant, each in fresh subprocesses; one row per variant."""
    variants = [("naive", None)] + [("chunked", c) for c in args.chunk_sizes]
    rows = []
    bar = tqdm(total=len(variants) * len(args.seeds), desc="memory", file=sys.stderr)
    for variant, chunk in variants:
        runs = []
        for seed in args.seeds:
            bar.set_postfix(variant=variant, chunk=chunk, seed=seed)
            runs.append(run_mem_child(args, variant, chunk or args.chunk_sizes[0], seed))
            bar.update()
        row = {
            "section": "logprob_entropy_memory",
            "variant": variant if chunk is None else f"chunked({chunk})",
            "chunk_size": chunk,
            "tokens": args.mem_tokens,
            "vocab": args.vocab,
            "logits_mib": runs[0]["logits_mib"],
            "baseline_rss_mib": runs[0]["baseline_rss_mib"],
            "baseline_peak_mib": runs[0]["baseline_peak_mib"],
            "ru_maxrss_baseline_mib": runs[0]["ru_maxrss_baseline_mib"],
            "n": len(runs),
        }
        row["peak_mib_mean"], row["peak_mib_std"] = benchlib.mean_std(
            r["peak_growth_mib"] for r in runs
        )
        row["ru_maxrss_growth_mib_mean"], _ = benchlib.mean_std(
            r["ru_maxrss_growth_mib"] for r in runs
        )
        row["ms_mean"], row["ms_std"] = benchlib.mean_std(
            t * 1e3 for r in runs for t in r["times_s"]
        )
        if chunk is None:
            row.update(max_abs_diff_logp=0.0, max_abs_diff_entropy=0.0, max_abs_diff_grad=0.0)
        else:
            row.update(check_agreement(chunk, args.vocab))
        rows.append(row)
    bar.close()
    return rows


# ---------------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512, help="responses per step")
    ap.add_argument("--tokens", type=int, default=2048, help="max response tokens (T)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size for (b)")
    ap.add_argument("--mem-tokens", type=int, default=2048, help="logit rows for (b)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--chunk-sizes",
        type=int,
        nargs="+",
        default=[256, 1024],
        help="chunk sizes of logprobs_and_entropy; the first (library default) is the headline",
    )
    ap.add_argument("--out", default="bench_results/core.json")
    ap.add_argument(
        "--default-malloc",
        action="store_true",
        help="time (a) with glibc's default allocator settings (page-fault bound)",
    )
    ap.add_argument(
        "--_mem-child", dest="mem_child", choices=["chunked", "naive"], help=argparse.SUPPRESS
    )
    ap.add_argument("--_mem-seed", dest="mem_seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.batch, args.tokens, args.vocab, args.mem_tokens, args.repeats) < 1:
        ap.error("sizes and --repeats must be >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    if args.mem_child is not None:
        mem_child(args)
        return
    t_start = time.perf_counter()
    malloc = "default" if args.default_malloc else keep_freed_memory()

    step_rows = bench_steps(args)
    print(f"\n(a) step math, batch {args.batch} x {args.tokens} tokens, {threads} threads")
    benchlib.print_table(
        step_rows,
        [
            "preset",
            "advantage",
            "kl",
            ("adv_ms_mean", "adv ms"),
            ("fwd_ms_mean", "fwd ms"),
            ("bwd_ms_mean", "bwd ms"),
            ("ms_mean", "fwd+bwd ms"),
            ("ms_std", "std"),
            ("tokens_per_s_mean", "tokens/s"),
        ],
    )

    mem_rows = bench_memory(args)
    print(
        f"\n(b) log-prob + entropy fwd+bwd, bf16 logits [{args.mem_tokens}, {args.vocab}], "
        "peak RSS growth over the allocated logits"
    )
    benchlib.print_table(
        mem_rows,
        [
            "variant",
            ("peak_mib_mean", "peak MiB"),
            ("peak_mib_std", "std"),
            ("ms_mean", "ms"),
            ("ms_std", "std"),
            ("max_abs_diff_logp", "dlogp"),
            ("max_abs_diff_entropy", "dH"),
            ("max_abs_diff_grad", "dgrad"),
        ],
    )

    chunked, naive = mem_rows[1], mem_rows[0]
    headline = {
        "metric": "peak memory, log-prob+entropy fwd+bwd (MiB)",
        "value": chunked["peak_mib_mean"],
        "baseline": naive["peak_mib_mean"],
        "ratio": naive["peak_mib_mean"] / max(chunked["peak_mib_mean"], 1e-9),
        "paper": None,
    }
    config = {
        "batch": args.batch,
        "tokens": args.tokens,
        "vocab": args.vocab,
        "mem_tokens": args.mem_tokens,
        "repeats": args.repeats,
        "warmup": "1 step per preset and seed in (a); none at full size in (b)",
        "malloc_step_timing": malloc,
        "chunk_sizes": args.chunk_sizes,
        "headline_chunk_size": args.chunk_sizes[0],
        "group_size": GROUP_SIZE,
        "lengths": "uniform integer in [1, tokens], right-padded",
        "rewards": "Bernoulli(0.5) per response",
        "presets": list(PRESET_NAMES),
        "torch_threads": threads,
        "device": "cpu",
        "logits_dtype": "bfloat16",
        "memory_measure": "growth of the peak RSS (VmHWM; ru_maxrss where there is no "
        "/proc) over its value right after allocating the logits, fresh subprocess per "
        "variant and seed",
        "malloc_memory_children": os.environ.get("MALLOC_MMAP_THRESHOLD_") or MMAP_THRESHOLD,
    }
    out = benchlib.write_result(
        args.out,
        name="core",
        catalog_ids=["base"],
        config=config,
        seeds=args.seeds,
        rows=step_rows + mem_rows,
        headline=headline,
    )
    print(
        f"\nheadline: {headline['metric']}: chunked {headline['value']:.1f} vs naive "
        f"{headline['baseline']:.1f}, ratio naive/chunked {headline['ratio']:.2f}"
    )
    print(f"wrote {out} in {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
