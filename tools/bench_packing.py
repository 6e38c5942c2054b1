"""Shared-prompt packing (000-21) vs the padded layout: one GRPO policy update (forward +
backward of the completion log-probs) of a group of N responses on the tiny Qwen2 model.

Command (defaults; writes bench_results/packing.json)::

    uv run --frozen python tools/bench_packing.py --n 4 8 16 --prompt 256 --response 64

The model is the tiny default's architecture (hidden 128, 4 layers, vocabulary of the
tiny tokenizer; ``--size`` another preset, ``--hidden`` a wider one with 64-wide heads)
with random weights and 512 positions. Per N: one prompt of ``--prompt`` random tokens
and N responses of ``--response`` tokens; the unpacked layout runs N sequences of
P + R tokens, a packed one a single sequence of P + N R tokens (``model.pack_prompts``).
All give the same log-probs (checked here, max abs difference printed). Time: median of
``--repeats`` runs after one warm-up, ``--threads`` CPU threads (2 by default); the
layouts take turns within each repeat (each turn times its second step: the first after
another layout's pays for the switch, its memory freed and mapped again), so that a
machine's drift falls on all of them, and ``speedup`` is the median over the repeats of
each repeat's padded / packed time.

``--layouts`` (default all five): the packed layouts timed beside the padded one, a row
each: ``auto`` (the trainer's default: what ``make_seq_batch`` picks with the trainer's
cost model and ``model.pack_min_gain``, named in ``chosen``), ``ragged`` (each
response's real tokens; attention densely in each packed row under its mask, a long
group split and its prompt repeated, or, where ``attends_by_sequence`` takes it, by
sequence: each ``[prompt; response]`` gathered into its own causal sequence, the groups
whole) and ``uniform`` (responses padded to ``R``, the shared-prompt attention op as the
model's attention function); ``ragged-dense`` is ``ragged`` always attending densely
(before the by-sequence form),
``uniform-sdpa`` is ``uniform`` with the op's CPU path before its split backend (SDPA
over the prompt's keys and values copied per response). ``--min-response``: each
response's length drawn uniformly from ``[min, R]`` (default ``R``: all full length). ``saved_mib``: what the autograd graph keeps for the backward (distinct
storages, the weights' included). ``of_rho`` is the speed-up over
``rho``; the headline's ratio is the smallest ``of_rho`` of the default (``auto``) rows.
``--malloc-mmap-kb``: glibc's mmap and trim thresholds fixed for both layouts. By default
they are glibc's own, as the trainer runs, and the padded layout's larger activations pay
page faults: at N=4, one thread, a 1 GiB threshold made the padded update 4.7 % faster and
``of_rho`` 0.882 instead of 0.922 (2026-12-06).

``flop_ceiling``: the padded layout's FLOPs over the packed one's, counting what each
needs (``2 x`` the decoder's non-embedding weights per input position, and ``4 x
hidden x layers`` per attended (query, key) pair, the forward: the trainer's
``decoder_cost``; the backward scales both
sides alike, the LM head is the same on both). ``rho`` counts positions only; attention
does not shrink by ``rho`` (every response still attends to the whole prompt), so the
ceiling is below ``rho``, and a ragged layout that repeats its prompt in split rows
lowers it further. ``of_ceiling`` = the speed-up over that ceiling: what overhead costs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import in_turns, print_table, write_result

LAYOUTS = ["auto", "ragged", "ragged-dense", "uniform", "uniform-sdpa"]


def layout_flops(sb, model) -> float:
    """Forward FLOPs of the decoder over ``sb``'s layout: what it needs (causal pairs of
    the real tokens), at the trainer's per-position and per-pair costs (``decoder_cost``;
    see the module docstring)."""
    from rlpost.llm.model.policy import decoder_cost

    per_pos, per_pair = decoder_cost(model)
    if sb.packed is None:  # the padded rows: every position, causal pairs of the real ones
        real = sb.attention_mask.sum(1).double()
        positions, pairs = sb.attention_mask.numel(), float((real * (real + 1) / 2).sum())
    elif sb.packed.allow is None:  # ragged by sequence: each [prompt; response], causally
        positions = sum(sb.packed.tokens)
        pairs = float(sum(len(s) * (len(s) + 1) / 2 for s in sb.packed.seqs))
    elif sb.packed.layout is None:  # ragged: the rows' real tokens, the pairs they allow
        positions, pairs = sum(sb.packed.tokens), float(sb.packed.allow.sum())
    else:  # uniform: the prompt once, each response over the prompt and itself
        positions, pairs = 0, 0.0
        for P, N, L in sb.packed.layout:
            positions += P + N * L
            pairs += P * (P + 1) / 2 + N * (L * P + L * (L + 1) / 2)
    return per_pos * positions + per_pair * pairs


@contextlib.contextmanager
def sdpa_only(on: bool) -> Iterator[None]:
    """With ``on``, the shared-prompt op's CPU path before its split backend: SDPA over the
    prompt's keys and values copied per response (the ``uniform-sdpa`` row)."""
    from rlpost.kernels.ops.shared_prompt import split

    real = split.available
    if on:
        split.available = lambda: False
    try:
        yield
    finally:
        split.available = real


def saved_mib(step) -> tuple[float, object]:
    """(MiB of distinct storages the autograd graph of ``step()`` keeps for its backward,
    the weights' included, ``step()``'s result)."""
    import torch

    seen: dict[int, int] = {}

    def keep(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = step()
    return sum(seen.values()) / 2**20, out


def chosen(sb) -> str:
    """The layout a batch was built in: padded, ragged or uniform."""
    if sb.packed is None:
        return "padded"
    return "ragged" if sb.packed.layout is None else "uniform"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--min-response", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", default="default", help="a tiny-model preset (SIZES)")
    ap.add_argument("--hidden", type=int, default=None, help="override the width")
    ap.add_argument(
        "--layouts", nargs="+", choices=LAYOUTS, default=LAYOUTS
    )  # fmt: skip
    ap.add_argument(
        "--malloc-mmap-kb", type=int, default=None,
        help="fix glibc's mmap and trim thresholds for both layouts (run.malloc_mmap_kb; "
        "default glibc's own, as the trainer runs: the padded layout's larger activations "
        "then pay page faults, about 5 %% of its time at N=4)",
    )  # fmt: skip
    ap.add_argument("--out", default="bench_results/packing.json")
    args = ap.parse_args()
    if args.malloc_mmap_kb is not None:
        from rlpost.core._env import fix_mmap_threshold

        if not fix_mmap_threshold(args.malloc_mmap_kb):
            sys.exit("bench_packing: --malloc-mmap-kb needs glibc's mallopt")

    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny
    from rlpost.llm.model.config import ModelConfig
    from rlpost.llm.model.policy import completion_logprobs, decoder_cost, make_seq_batch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    cfg = tiny.tiny_config(tok, size=args.size)
    cfg.max_position_embeddings = 512
    if args.hidden:  # 64-wide heads, two query heads per key / value head
        heads = max(1, args.hidden // 64)
        cfg.hidden_size, cfg.intermediate_size, cfg.head_dim = args.hidden, 4 * args.hidden, 64
        cfg.num_attention_heads, cfg.num_key_value_heads = heads, max(1, heads // 2)
    model = Qwen2ForCausalLM(cfg).train()
    trainer = {"min_gain": ModelConfig().pack_min_gain, "cost": decoder_cost(model)}
    V = cfg.vocab_size
    rows = []
    for n in args.n:
        g = torch.Generator().manual_seed(n)
        prompt = torch.randint(3, V, (args.prompt,), generator=g).tolist()
        comp = torch.randint(3, V, (n, args.response), generator=g)
        low = args.response if args.min_response is None else args.min_response
        lengths = torch.randint(low, args.response + 1, (n, 1), generator=g)
        mask = (torch.arange(args.response)[None] < lengths).float()
        steps, lps, saved = {}, {}, {}
        for layout in ["padded", *args.layouts]:
            pack = layout != "padded"
            sb = make_seq_batch(
                [prompt] * n, comp, mask, tok.pad_token_id, pack=pack,
                layout=layout.split("-")[0] if pack else "ragged",
                sequences=layout != "ragged-dense", **(trainer if layout == "auto" else {}),
            )  # fmt: skip

            def step(sb=sb, old=layout == "uniform-sdpa", mask=mask):
                model.zero_grad(set_to_none=True)
                with sdpa_only(old):
                    lp, _ = completion_logprobs(model, sb, 1.0, impl="fused")
                    (lp * mask).sum().backward()
                return lp.detach() * mask

            steps[layout] = (step, sb)
            saved[layout], lps[layout] = saved_mib(step)  # (also the warm-up)
        times = in_turns(list(steps), args.repeats, lambda k, s=steps: s[k][0]())
        res = {  # the speed-up: the median of each repeat's own ratio (drift cancels)
            k: (statistics.median(ts), lps[k], layout_flops(steps[k][1], model),
                chosen(steps[k][1]),
                statistics.median(a / b for a, b in zip(times["padded"], ts, strict=True)))
            for k, ts in times.items()
        }  # fmt: skip
        t_pad, lp_pad, f_pad, _, _ = res["padded"]
        real = args.prompt + int(lengths.sum())  # the ideal packing's positions
        rho = n * (args.prompt + args.response) / real  # (full length: packing_ratio's)
        for layout in args.layouts:
            t_pack, lp_pack, f_pack, picked, speedup = res[layout]
            rows.append(
                {
                    "N": n,
                    "layout": layout,
                    "chosen": picked,
                    "tokens_padded": n * (args.prompt + args.response),
                    "tokens_packed": real,
                    "rho_theory": rho,
                    "s_padded": t_pad,
                    "s_packed": t_pack,
                    "speedup": speedup,
                    "of_rho": speedup / rho,
                    "flop_ceiling": f_pad / f_pack,
                    "of_ceiling": speedup / (f_pad / f_pack),
                    "saved_mib_padded": saved["padded"],
                    "saved_mib": saved[layout],
                    "max_logp_diff": float((lp_pad - lp_pack).abs().max()),
                }
            )
            print(f"  N={n}: {t_pad:.3f} s padded, {t_pack:.3f} s {layout}", flush=True)
    print(
        f"\nGRPO policy update (fwd + bwd of completion log-probs), Qwen2 hidden "
        f"{cfg.hidden_size}, P={args.prompt}, R={args.response}, {args.threads} threads, "
        f"median of {args.repeats}"
    )
    print_table(rows, list(rows[0]))
    default = [r for r in rows if r["layout"] == "auto"] or rows
    last, worst = default[-1], min(default, key=lambda r: r["of_rho"])
    write_result(
        args.out,
        name="packing",
        catalog_ids=["000-21"],
        config=vars(args),
        seeds=[0],
        rows=rows,
        headline={
            "metric": f"update speed-up from {last['layout']} packing at N={last['N']}",
            "value": last["speedup"],
            "baseline": 1.0,
            "ratio": worst["of_rho"],  # the default layout's smallest fraction of rho
            "paper": "per-token work cut by rho = N(P+R)/(P+NR)",
        },
    )


if __name__ == "__main__":
    main()
