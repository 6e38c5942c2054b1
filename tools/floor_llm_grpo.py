"""The floor of the GRPO step's work on this machine, beside the measured steps of rlpost
and TRL (a ``tools/bench_llm_grpo.py --grid`` result): how far each side runs above what its
matrix products, its fused attention and its key / value reads alone take, and so the
largest speed-up over TRL that the same work allows here.

Command (the dense-reward grid, where every row trains; one thread, as the grid)::

    uv run --frozen python tools/floor_llm_grpo.py \\
        --grid docs/results/llm_grpo_grid_dense_2026-12-06.json --plot bench_results/floor.png

``--plot``: each cell's steps as multiples of its floor (rlpost's, TRL's, and half of TRL's:
where 2x TRL lies); ``--replot RESULT``: that figure from a result of this tool, nothing
timed.

Per cell the floor is the sum of four parts, each timed here (median of ``--repeats``):

* ``rollout_weights``: each generated token through every weight matrix as the lean
  engine's decode step multiplies them (q / k / v in one product, gate / up in one; the
  head), at the batch's fullest (``R = P G`` rows: fewer rows multiply less efficiently, so
  this is the lower bound), and the prefill's prompt tokens;
* ``rollout_kv``: what each decode step must read, every row's keys and values so far, at
  this machine's streaming read rate (a sum over 256 MiB): no kernel reads them faster;
* ``update_weights``: the forward (``X W^T``) and both backward products (``G W``,
  ``G^T X``) of every weight matrix over the update's ``R (p + l)`` real positions (no
  padding), the head's over the ``R l`` completion positions;
* ``update_attention``: torch's fused attention (the kernel both sides call), forward and
  backward, causal, no mask, grouped heads, over ``R`` sequences of ``p + l`` tokens, per
  layer.

``p``: the cell's mean prompt tokens; ``l``: rlpost's mean generated tokens per row (a
mean, where rows differ: the key / value reads grow with the square of a row's length, so
the mean under-counts them; the floor stays a floor). Not counted: norms, rotary,
activations, the loss, sampling, the optimizer, which both sides also run. ``best_ratio``:
TRL's CPU time per generated token over the floor's, the speed-up in tokens per
CPU-second the same work could reach at no overhead at all; ``ratio``: the grid's;
``*_rollout_over_floor`` / ``*_update_over_floor``: a side's rollout (update) time in the
grid over the floor's rollout (update) parts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from benchlib import print_table, write_result

STREAM_MIB = 256


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def stream_rate(repeats: int) -> float:
    """Bytes per second of a float32 sum over ``STREAM_MIB`` MiB (one thread)."""
    import torch

    x = torch.ones(STREAM_MIB * 2**20 // 4)
    return x.numel() * 4 / timed(lambda: x.sum(), repeats)


def head_dim(cfg) -> int:
    """The model's attention head width (``head_dim``, else hidden over heads)."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def weight_shapes(cfg) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``(decode, update)`` weight matrices of one layer as ``(out, in)``: the decode's
    with q / k / v and gate / up concatenated (the lean engine's fused step)."""
    D, inter = cfg.hidden_size, cfg.intermediate_size
    hd = head_dim(cfg)
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    update = [(q, D), (kv, D), (kv, D), (D, q), (inter, D), (inter, D), (D, inter)]
    return [(q + 2 * kv, D), (D, q), (2 * inter, D), (D, inter)], update


def products_s(rows: int, shapes: list[tuple[int, int]], backward: bool, repeats: int) -> float:
    """Seconds of ``[rows, in] x W^T`` for each ``(out, in)``, and with ``backward`` the
    two products of its backward (``G W``, ``G^T X``)."""
    import torch

    total = 0.0
    for out, inp in shapes:
        x, w, g = torch.randn(rows, inp), torch.randn(out, inp), torch.randn(rows, out)
        total += timed(lambda x=x, w=w: torch.nn.functional.linear(x, w), repeats)
        if backward:
            total += timed(lambda g=g, w=w: g @ w, repeats)
            total += timed(lambda g=g, x=x: g.t() @ x, repeats)
    return total


def attention_s(cfg, rows: int, T: int, repeats: int) -> float:
    """Seconds of one layer's fused causal attention, forward and backward, over ``rows``
    sequences of ``T`` tokens (grouped key / value heads read as they are)."""
    import torch

    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = head_dim(cfg)
    q = torch.randn(rows, H, T, d, requires_grad=True)
    k = torch.randn(rows, Hkv, T, d, requires_grad=True)
    v = torch.randn(rows, Hkv, T, d, requires_grad=True)
    g = torch.randn(rows, H, T, d)

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=Hkv < H
        )
        out.backward(g)

    return timed(run, repeats)


def cell_floor(cfg, cell: dict, p: float, rate: float, repeats: int) -> dict:
    """The four parts of one cell's floor in milliseconds (module docstring)."""
    R = cell["prompts"] * cell["group_size"]
    gen = cell["gen_tokens_per_step"]
    n, layers = gen / R, cfg.num_hidden_layers  # n: the mean generated tokens a row (l)
    decode, update = weight_shapes(cfg)
    head = [(cfg.vocab_size, cfg.hidden_size)]
    per_step = layers * products_s(R, decode, False, repeats) + products_s(R, head, False, repeats)
    prefill = per_step * cell["prompts"] * p / R  # the prompts once each, at the same rate
    hd = head_dim(cfg)
    kv_row = layers * 2 * cfg.num_key_value_heads * hd * 4  # bytes per cached token
    reads = R * kv_row * (n * p + n * (n + 1) / 2)  # step t reads p + t + 1 tokens a row
    positions = round(R * (p + n))
    upd = layers * products_s(positions, update, True, repeats)
    upd += products_s(round(gen), head, True, repeats)
    att = layers * attention_s(cfg, R, round(p + n), repeats)
    parts = {
        "rollout_weights_ms": 1e3 * (per_step * n + prefill),
        "rollout_kv_ms": 1e3 * reads / rate,
        "update_weights_ms": 1e3 * upd,
        "update_attention_ms": 1e3 * att,
    }
    return {**parts, "floor_ms": sum(parts.values())}


def grid_cells(grid: dict) -> list[dict]:
    """Per cell: its spec with both sides' mean CPU ms and generated tokens per step."""
    specs = {c["name"]: c for c in grid["config"]["cells"]}
    means = {(r["cell"], r["side"]): r for r in grid["rows"] if r["seed"] == "mean"}
    skipped: dict[str, list[float]] = {}  # rlpost's share of rows left out of the update
    for r in grid["rows"]:
        if r["seed"] != "mean" and r["side"] == "rlpost":
            skipped.setdefault(r["cell"], []).append(r.get("skipped_rows", 0.0))
    out = []
    for name, spec in specs.items():
        ours, trl = means.get((name, "rlpost")), means.get((name, "trl"))
        ratio = means.get((name, "rlpost/TRL"))
        if ours is None or trl is None or ratio is None:
            continue
        out.append(
            {
                **spec,
                "gen_tokens_per_step": ours["gen_tokens_per_step"],
                "rlpost_cpu_ms": ours["cpu_ms"],
                "trl_cpu_ms": trl["cpu_ms"],
                **{
                    f"{side}_{part}_ms": row[f"{part}_ms"]
                    for side, row in (("rlpost", ours), ("trl", trl))
                    for part in ("rollout", "update")
                },
                "trl_tokens_per_step": trl["gen_tokens_per_step"],
                "ratio": ratio["cpu_tok_s"],
                "rlpost_skipped_rows": statistics.mean(skipped.get(name, [0.0])),
            }
        )
    return out


def prompt_tokens(cell: dict, seeds: list[int], tok) -> float:
    """Mean prompt tokens of the prompts the grid drew for ``cell`` (every seed)."""
    from bench_llm_grpo import make_prompts

    n = cell["prompts"] * (cell["warmup"] + cell["steps"])
    lens = [len(tok(e["prompt"]).input_ids) for s in seeds for e in make_prompts(n, s)]
    return statistics.mean(lens)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--grid", help="a bench_llm_grpo.py --grid result")
    src.add_argument("--replot", help="a result of this tool: draw --plot from it only")
    ap.add_argument("--cells", nargs="+", default=None, help="these cells only (names)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench_results/llm_grpo_floor.json")
    ap.add_argument("--plot", default=None, help="a PNG of the steps over the floor")
    args = ap.parse_args()
    if args.replot:
        if not args.plot:
            sys.exit("floor_llm_grpo: --replot needs --plot PATH")
        found = Path(args.replot)
        if not found.is_file():
            sys.exit(f"floor_llm_grpo: no result at {found}")
        plot(json.loads(found.read_text())["rows"], args.plot)
        return
    path = Path(args.grid)
    if not path.is_file():
        sys.exit(f"floor_llm_grpo: no grid result at {path}")
    grid = json.loads(path.read_text())
    if "cells" not in grid.get("config", {}):
        sys.exit(f"floor_llm_grpo: {path} is not a --grid result (no config.cells)")

    import torch

    from rlpost.llm.model import tiny

    torch.set_num_threads(1)  # the grid's setting (tokens per CPU-second)
    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    cfg = tiny.tiny_config(tok, size=grid["config"]["model"]["size"])
    rate = stream_rate(args.repeats)
    rows = []
    for cell in grid_cells(grid):
        if args.cells and cell["name"] not in args.cells:
            continue
        p = prompt_tokens(cell, grid["seeds"], tok)
        floor = cell_floor(cfg, cell, p, rate, args.repeats)
        rollout = floor["rollout_weights_ms"] + floor["rollout_kv_ms"]
        update = floor["update_weights_ms"] + floor["update_attention_ms"]
        per_token = floor["floor_ms"] / cell["gen_tokens_per_step"]
        trl_per_token = cell["trl_cpu_ms"] / cell["trl_tokens_per_step"]
        rows.append(
            {
                "cell": cell["name"],
                "full_length": cell["full_length"],
                "prompt_tokens": p,
                "tokens_per_row": cell["gen_tokens_per_step"] / (cell["prompts"] * cell["group_size"]),
                **floor,
                "rlpost_ms": cell["rlpost_cpu_ms"],
                "trl_ms": cell["trl_cpu_ms"],
                "rlpost_over_floor": cell["rlpost_cpu_ms"] / floor["floor_ms"],
                "trl_over_floor": cell["trl_cpu_ms"] / floor["floor_ms"],
                **{f"{side}_{part}_over_floor": cell[f"{side}_{part}_ms"] / low
                   for side in ("rlpost", "trl")
                   for part, low in (("rollout", rollout), ("update", update))},
                "ratio": cell["ratio"],
                "best_ratio": trl_per_token / per_token,
                "rlpost_skipped_rows": cell["rlpost_skipped_rows"],
            }
        )  # fmt: skip
        print(f"  {cell['name']}: floor {floor['floor_ms']:.0f} ms", flush=True)
    if not rows:
        sys.exit("floor_llm_grpo: no cell of the grid matched")
    print(
        f"\nGRPO step floor, one thread, streaming read {rate / 1e9:.1f} GB/s "
        f"(grid: {path.name}); times in ms of one step"
    )
    print_table(
        rows,
        ["cell", "prompt_tokens", "tokens_per_row", "rollout_weights_ms", "rollout_kv_ms",
         "update_weights_ms", "update_attention_ms", "floor_ms", "rlpost_ms", "trl_ms",
         "rlpost_over_floor", "trl_over_floor", "rlpost_rollout_over_floor",
         "rlpost_update_over_floor", "ratio", "best_ratio"],
    )  # fmt: skip
    lean = [r["cell"] for r in rows if r["rlpost_skipped_rows"] > 0.05]
    if lean:
        print(
            f"note: rlpost left rows out of the update in {', '.join(lean)} "
            "(optim.skip_inert_rows): its work there is less than the floor counts, "
            "which is the whole update's (TRL's work)"
        )
    full = [r for r in rows if r["full_length"]] or rows
    worst = min(full, key=lambda r: r["best_ratio"])
    write_result(
        args.out,
        name="llm_grpo_floor",
        catalog_ids=[],
        config={**vars(args), "stream_gb_s": rate / 1e9, "threads": 1},
        seeds=grid["seeds"],
        rows=rows,
        headline={
            "metric": "the largest speed-up over TRL the same work allows (TRL's CPU time per "
            "token over the floor's), smallest full-length cell",
            "value": worst["best_ratio"],
            "baseline": 2.0,  # issue 45's target
            "ratio": worst["best_ratio"] / 2.0,
            "paper": None,
            "cell": worst["cell"],
            "measured_ratio": worst["ratio"],
        },
    )
    if args.plot:
        plot(rows, args.plot)


def plot(rows: list[dict], path: str) -> None:
    """Each cell's steps as multiples of its floor: rlpost's and TRL's bars, and a mark at
    half of TRL's (the step 2x TRL needs; below 1, under the floor itself)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar([i - 0.2 for i in x], [r["rlpost_over_floor"] for r in rows], 0.4, label="rlpost")
    ax.bar([i + 0.2 for i in x], [r["trl_over_floor"] for r in rows], 0.4, label="TRL")
    half = [r["trl_over_floor"] / 2 for r in rows]
    ax.scatter(x, half, marker="_", s=300, color="k", zorder=3, label="2x TRL needs")
    ax.axhline(1.0, color="r", lw=1, label="the floor")
    ax.set_xticks(list(x), [r["cell"] for r in rows], rotation=45, ha="right")
    ax.set_yscale("log")
    ticks = [1, 1.5, 2, 3, 5, 10, 20]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set(ylabel="step time / floor (log)", title="GRPO step over the floor of its work (CPU)")
    ax.legend(ncol=4, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
