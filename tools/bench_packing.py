"""Shared-prompt packing (000-21) vs the padded layout: one GRPO policy update (forward +
backward of the completion log-probs) of a group of N responses on the tiny Qwen2 model.

Command (defaults; writes bench_results/packing.json)::

    uv run --frozen python tools/bench_packing.py --n 4 8 16 --prompt 256 --response 64

The model is the tiny default's architecture (hidden 128, 4 layers, vocabulary of the
tiny tokenizer) with random weights and 512 positions. Per N: one prompt of ``--prompt``
random tokens and N responses of ``--response`` tokens; the unpacked layout runs N
sequences of P + R tokens, the packed one a single sequence of P + N R tokens with the
shared-prompt 4D mask (``model.pack_prompts``). Both use the fused log-prob op and give
the same log-probs (checked here, max abs difference printed). Time: median of
``--repeats`` runs after one warm-up, 2 CPU threads.

``--layouts`` (default both): the packed layouts timed beside the padded one, a row each:
``ragged`` (the trainer's default: each response's real tokens, the model's own attention
under a 4D mask) and ``uniform`` (responses padded to ``R``, the shared-prompt attention
op as the model's attention function). ``of_rho`` is the speed-up over ``rho``.

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
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import print_table, write_result


def layout_flops(sb, model) -> float:
    """Forward FLOPs of the decoder over ``sb``'s layout: what it needs (causal pairs of
    the real tokens), at the trainer's per-position and per-pair costs (``decoder_cost``;
    see the module docstring)."""
    from rlpost.llm.model.policy import decoder_cost

    per_pos, per_pair = decoder_cost(model)
    if sb.packed is None:  # the padded rows: every position, causal pairs of the real ones
        real = sb.attention_mask.sum(1).double()
        positions, pairs = sb.attention_mask.numel(), float((real * (real + 1) / 2).sum())
    elif sb.packed.layout is None:  # ragged: the rows' real tokens, the pairs they allow
        positions, pairs = sum(sb.packed.tokens), float(sb.packed.allow.sum())
    else:  # uniform: the prompt once, each response over the prompt and itself
        positions, pairs = 0, 0.0
        for P, N, L in sb.packed.layout:
            positions += P + N * L
            pairs += P * (P + 1) / 2 + N * (L * P + L * (L + 1) / 2)
    return per_pos * positions + per_pair * pairs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", nargs="+", default=["ragged", "uniform"])
    ap.add_argument("--out", default="bench_results/packing.json")
    args = ap.parse_args()

    import torch
    from transformers import Qwen2ForCausalLM

    from rlpost.kernels.ops.shared_prompt import packing_ratio
    from rlpost.llm.model import tiny
    from rlpost.llm.model.policy import completion_logprobs, make_seq_batch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    cfg = tiny.tiny_config(tok)
    cfg.max_position_embeddings = 512
    model = Qwen2ForCausalLM(cfg).train()
    V = cfg.vocab_size
    rows = []
    for n in args.n:
        g = torch.Generator().manual_seed(n)
        prompt = torch.randint(3, V, (args.prompt,), generator=g).tolist()
        comp = torch.randint(3, V, (n, args.response), generator=g)
        mask = torch.ones(n, args.response)
        res = {}
        for layout in ["padded", *args.layouts]:
            pack = layout != "padded"
            sb = make_seq_batch(
                [prompt] * n, comp, mask, tok.pad_token_id, pack=pack,
                layout=layout if pack else "ragged",
            )  # fmt: skip

            def step(sb=sb):
                model.zero_grad(set_to_none=True)
                lp, _ = completion_logprobs(model, sb, 1.0, impl="fused")
                lp.sum().backward()
                return lp.detach()

            lp = step()  # warm-up
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            res[layout] = (statistics.median(times), lp, layout_flops(sb, model))
        t_pad, lp_pad, f_pad = res["padded"]
        rho = packing_ratio(n, args.prompt, args.response)
        for layout in args.layouts:
            t_pack, lp_pack, f_pack = res[layout]
            rows.append(
                {
                    "N": n,
                    "layout": layout,
                    "tokens_padded": n * (args.prompt + args.response),
                    "tokens_packed": args.prompt + n * args.response,
                    "rho_theory": rho,
                    "s_padded": t_pad,
                    "s_packed": t_pack,
                    "speedup": t_pad / t_pack,
                    "of_rho": t_pad / t_pack / rho,
                    "flop_ceiling": f_pad / f_pack,
                    "of_ceiling": t_pad / t_pack / (f_pad / f_pack),
                    "max_logp_diff": float((lp_pad - lp_pack).abs().max()),
                }
            )
            print(f"  N={n}: {t_pad:.3f} s padded, {t_pack:.3f} s {layout}", flush=True)
    print(
        f"\nGRPO policy update (fwd + bwd of completion log-probs), tiny Qwen2, "
        f"P={args.prompt}, R={args.response}, median of {args.repeats}"
    )
    print_table(rows, list(rows[0]))
    last = rows[-1]
    worst = min(rows, key=lambda r: r["of_rho"])
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
            "ratio": worst["of_rho"],  # the smallest fraction of rho over the rows
            "paper": "per-token work cut by rho = N(P+R)/(P+NR)",
        },
    )


if __name__ == "__main__":
    main()
