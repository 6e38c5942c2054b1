"""The ragged packed layout's attention, forward + backward, in its two forms: ``dense``
(the packed rows gathered into padded rows, one SDPA call under their ``[T, T]`` masks)
against ``by_sequence`` (each response's ``[prompt; response]`` gathered into its own
right-padded causal sequence, one SDPA call per length bucket, no mask).

Command (defaults; writes bench_results/ragged_attention.json)::

    uv run --frozen python tools/bench_ragged_attention.py

Per case: ``groups`` prompts of about ``P`` tokens, ``G`` responses each, lengths drawn
uniformly from ``[low, R]``; laid out by ``pack_groups`` as the trainer does (its
``ROW_TOKENS`` split, the last token of each response left out). Heads: 4 query and 2 key
/ value heads of width 32 (the tiny model's). The two forms take turns ``--repeats`` times
(each turn the median of three calls after an untimed one) on the same float32 inputs;
``speedup`` is the median of the per-turn ratios dense / by sequence. ``pairs_*``: the
(query, key) pairs each form computes (``ragged_pairs``); ``mean_seq``: the sequences'
mean length; ``chosen``: what ``attends_by_sequence`` picks (by sequence where the
sequences average at least 64 tokens and the dense rows compute twice the pairs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import in_turns, print_table, write_result

# (prompts, responses each, longest response, shortest response, prompt length)
CASES = [(8, 8, 8, 1, 8), (8, 16, 8, 1, 8), (8, 16, 16, 1, 8), (8, 8, 32, 1, 8),
         (8, 16, 32, 4, 8), (16, 8, 32, 1, 8), (4, 16, 64, 1, 30), (8, 16, 128, 4, 8),
         (1, 8, 128, 8, 10), (1, 16, 128, 8, 10), (1, 32, 128, 8, 10), (1, 8, 128, 128, 10),
         (1, 16, 128, 128, 10), (1, 16, 128, 32, 64), (1, 16, 128, 100, 200),
         (1, 8, 128, 60, 300)]  # fmt: skip
H, H_KV, D = 4, 2, 32


def layout(groups: int, n: int, R: int, low: int, P: int, seed: int):
    """The ragged ``PackedGroups`` of one case."""
    import torch

    from rlpost.kernels.ops.shared_prompt import pack_groups
    from rlpost.llm.model.policy import ROW_TOKENS

    rnd = random.Random(seed)
    prompts = []
    for _ in range(groups):
        prompts += [[rnd.randrange(3, 40) for _ in range(max(1, P + rnd.randrange(-2, 2)))]] * n
    comp = torch.randint(3, 40, (len(prompts), R), generator=torch.Generator().manual_seed(seed))
    lengths = torch.tensor([rnd.randint(low, R) for _ in prompts])
    return pack_groups(prompts, comp, 0, lengths, row_tokens=ROW_TOKENS, last_token=False)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_results/ragged_attention.json")
    args = ap.parse_args()

    import torch

    from rlpost.kernels.ops.shared_prompt.reference import attends_by_sequence, ragged_pairs
    from rlpost.llm.model import packing

    torch.set_num_threads(args.threads)
    rows = []
    for case in CASES:
        pk = layout(*case, seed=args.seed)
        G, T = pk.input_ids.shape
        lens = [len(s) for s in pk.seqs]
        n_tok = sum(pk.tokens)
        g = torch.Generator().manual_seed(args.seed)
        ins = [torch.randn(1, h, n_tok, D, generator=g).requires_grad_() for h in (H, H_KV, H_KV)]
        grad_out = torch.randn(1, n_tok, H, D, generator=g)
        forms = {
            "dense": packing.flat_rows(pk.tokens, T, pk.allow),
            "by_sequence": packing.flat_rows(pk.tokens, T, pk.allow, pk.seqs),
        }

        def call(form: str, forms=forms, ins=ins, grad_out=grad_out) -> None:
            token = packing._LAYOUT.set(forms[form])
            try:
                for x in ins:
                    x.grad = None
                out, _ = packing._rows_attention(None, *ins, None, D**-0.5)
                out.backward(grad_out)
            finally:
                packing._LAYOUT.reset(token)

        times = in_turns(list(forms), args.repeats, call)
        dense, by_seq = ragged_pairs(G, T, lens)
        ratios = [a / b for a, b in zip(times["dense"], times["by_sequence"], strict=True)]
        rows.append(
            {
                "prompts": case[0],
                "G": case[1],
                "R": case[2],
                "low": case[3],
                "P": case[4],
                "mean_seq": sum(lens) / len(lens),
                "ms_dense": 1e3 * statistics.median(times["dense"]),
                "ms_by_sequence": 1e3 * statistics.median(times["by_sequence"]),
                "speedup": statistics.median(ratios),
                "pairs_dense": dense,
                "pairs_by_sequence": by_seq,
                "chosen": "by_sequence" if attends_by_sequence(G, T, lens) else "dense",
            }
        )
        print(f"  {case}: {rows[-1]['speedup']:.2f}x by sequence", flush=True)
    print(f"\nragged attention, fwd + bwd, H={H}/{H_KV} d={D}, {args.threads} thread(s)")
    print_table(rows, list(rows[0]))
    picked = [r["speedup"] if r["chosen"] == "by_sequence" else 1.0 for r in rows]
    best = [max(r["speedup"], 1.0) for r in rows]
    write_result(
        args.out,
        name="ragged_attention",
        catalog_ids=["000-21"],
        config=vars(args),
        seeds=[args.seed],
        rows=rows,
        headline={
            "metric": "attention speed-up of the chosen form over dense, worst case",
            "value": min(picked),
            "baseline": 1.0,
            "ratio": min(p / b for p, b in zip(picked, best, strict=True)),  # of the best
            "paper": None,
        },
    )


if __name__ == "__main__":
    main()
