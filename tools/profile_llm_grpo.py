"""Where a GRPO step's time goes: the workload of tools/bench_llm_grpo.py, profiled.

Command (the benchmark's default workload, then the longer one of issue 18)::

    uv run --frozen python tools/profile_llm_grpo.py --prompts 16 --group-size 8 \\
        --max-new-tokens 8 --out bench_results/llm_grpo_profile_8tok.json
    uv run --frozen python tools/profile_llm_grpo.py --prompts 8 --group-size 8 \\
        --max-new-tokens 64 --out bench_results/llm_grpo_profile_64tok.json

Two runs of the same seeded trainer (the benchmark's config, ``rlpost_config``): one plain,
whose per-step wall time and the trainer's own ``time/rollout`` / ``time/update`` are the
reference, and one under ``cProfile``, whose cumulative times split the step into

* generation: the trainer's call into the rollout engine (the rollout sources'
  ``generate``; the lean engine by default, or HF), per generated token;
* reward: scoring the completions;
* no-grad forwards: the old / reference log-probabilities recomputed before the update;
* training forward + loss: the update's forwards with gradients and the objective;
* backward; optimizer step (with gradient clipping);
* rest of collect: prompt batching, tokenising, dynamic-sampling bookkeeping;
* bookkeeping between steps: metrics, logging, the step loop (not the end-of-run plots).

cProfile adds a cost per Python call, so Python-heavy parts (the per-token loop of
``generate``) are inflated relative to the plain run; the table gives each part's share of
the profiled step and the plain run's step time beside it. Prints a table, writes JSON.

``--reward`` as the benchmark's: ``exact`` (the default; the untrained model scores 0 in
every group, so every row is inert and the update skips it) or ``digits`` (dense: the
update does its work).

``--ops`` adds a third run whose steps after the warm-up go through ``torch.profiler``:
the operators' self CPU time per step, grouped into matrix products (``mm``, ``addmm``,
``bmm``: the decode's attention over its KV cache is ``bmm``), fused attention (SDPA's
kernels, forward and backward) and everything else, with the top operators by name.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_llm_grpo import digit_share, rlpost_config, save_model

PARTS = {
    # the trainer's one call into whichever engine it runs (lean, HF, Ray, speculative...)
    "generation": [("rlpost/llm/rollout/sources/groups.py", "generate")],
    "reward": [("rlpost/llm/rollout/scoring.py", "score")],
    "no-grad forwards": [("rlpost/llm/train/forward.py", "nograd")],
    "update (all)": [("rlpost/llm/trainer.py", "update")],
    "backward": [("torch/_tensor.py", "backward")],
    "optimizer step": [("torch/optim/optimizer.py", "wrapper")],
    "grad clip": [("torch/nn/utils/clip_grad.py", "clip_grad_norm_")],
    "step (all)": [
        ("rlpost/llm/rollout/sources/groups.py", "collect"),
        ("rlpost/llm/trainer.py", "update"),
    ],
}


PARAMS = (
    "prompts", "group_size", "max_new_tokens", "steps", "warmup", "threads", "seed", "size",
    "full_length", "reward",
)  # fmt: skip


def _cumulative(stats: pstats.Stats, file_part: str, name: str) -> float:
    total = 0.0
    for (filename, _, func), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and filename.replace("\\", "/").endswith(file_part):
            total = max(total, ct)  # recursive wrappers: the outermost
    return total


def _trainer(spec: dict, run_dir: Path):
    from rlpost.llm.data.tasks import make_task
    from rlpost.llm.trainer import Trainer

    if spec.get("reward", "exact") == "exact":
        return Trainer(rlpost_config(spec, run_dir), reward_fn=make_task("arithmetic").score)
    return Trainer(rlpost_config(spec, run_dir), reward_fn=lambda c, ex: digit_share(c))


def run(spec: dict) -> dict:
    import torch

    from rlpost.llm.tools.runlog import read_metrics

    torch.set_num_threads(spec["threads"])
    work = Path(spec["work"])
    spec["model"] = str(work / "model")
    params = save_model(Path(spec["model"]), spec["size"], spec["seed"])
    total = spec["warmup"] + spec["steps"]

    plain_dir = work / "plain"
    t = _trainer(spec, plain_dir)
    stamps: list[float] = []
    log = t.logger.log
    t.logger.log = lambda step, m: (stamps.append(time.perf_counter()), log(step, m))
    t.train()
    rows = [r for r in read_metrics(plain_dir) if r["step"] > spec["warmup"]]
    w = spec["warmup"]
    period = [b - a for a, b in zip(stamps[w - 1 : -1], stamps[w:], strict=True)]
    plain = {
        "step_ms": 1000 * sum(period) / len(period),
        "rollout_ms": 1000 * sum(r["time/rollout"] for r in rows) / len(rows),
        "update_ms": 1000 * sum(r["time/update"] for r in rows) / len(rows),
        "generated_tokens": sum(r["tokens/generated"] for r in rows) / len(rows),
    }

    prof_dir = work / "profiled"
    t = _trainer(spec, prof_dir)
    marks: dict[str, float] = {}
    step, log = t.rollouts.step, t.logger.log

    def first_step(stop):
        marks.setdefault("loop_start", time.perf_counter())
        return step(stop)

    def last_log(step, m):
        log(step, m)
        marks["loop_end"] = time.perf_counter()

    t.rollouts.step, t.logger.log = first_step, last_log
    prof = cProfile.Profile()
    prof.enable()
    t.train()
    prof.disable()
    loop = marks["loop_end"] - marks["loop_start"]
    stats = pstats.Stats(prof)
    raw = {k: sum(_cumulative(stats, f, n) for f, n in v) for k, v in PARTS.items()}
    step_all = raw.pop("step (all)")
    upd = raw.pop("update (all)")
    parts = {
        "generation": raw["generation"],
        "reward": raw["reward"],
        "no-grad forwards": raw["no-grad forwards"],
        "training forward + loss": upd
        - raw["backward"]
        - raw["optimizer step"]
        - raw["grad clip"]
        - raw["no-grad forwards"],
        "backward": raw["backward"],
        "optimizer step + clip": raw["optimizer step"] + raw["grad clip"],
        "rest of collect": step_all - upd - raw["generation"] - raw["reward"],
        "bookkeeping between steps": max(0.0, loop - step_all),
    }
    per_step = {k: 1000 * v / total for k, v in parts.items()}
    step_ms = 1000 * loop / total
    return {
        "name": "llm_grpo_profile",
        "params": {k: spec[k] for k in PARAMS},
        "model_parameters": params,
        "plain": plain,
        "profiled": {
            "step_ms": step_ms,
            "parts_ms": per_step,
            "share": {k: v / step_ms for k, v in per_step.items()},
            "generation_ms_per_token": per_step["generation"] / max(plain["generated_tokens"], 1),
        },
        "engine": type(t.engine).__name__,
        "note": "profiled times include cProfile's per-call cost; all steps incl. warm-up",
    }


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def op_table(spec: dict, top: int = 12) -> dict:
    """Operator self CPU time per step over the steps after the warm-up (``torch.profiler``),
    in three groups and the ``top`` operators by name."""
    from torch.profiler import ProfilerActivity, profile

    t = _trainer(spec, Path(spec["work"]) / "ops")
    t.train(until=spec["warmup"])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t.train()
    steps = spec["steps"]
    ops = [
        (e.key, e.self_cpu_time_total / 1000 / steps, e.count / steps) for e in prof.key_averages()
    ]
    total = sum(ms for _, ms, _ in ops)
    groups = {"matrix products": 0.0, "fused attention (SDPA)": 0.0, "everything else": 0.0}
    for name, ms, _ in ops:
        if name in MATMUL_OPS:
            groups["matrix products"] += ms
        elif "scaled_dot_product" in name:
            groups["fused attention (SDPA)"] += ms
        else:
            groups["everything else"] += ms
    ranked = sorted(ops, key=lambda o: -o[1])[:top]
    return {
        "self_cpu_ms_per_step": total,
        "groups_ms": groups,
        "top": [{"op": n, "ms_per_step": ms, "share": ms / total, "calls_per_step": c}
                for n, ms, c in ranked],
    }  # fmt: skip


def format_ops(ops: dict) -> str:
    total = ops["self_cpu_ms_per_step"]
    lines = [f"operators (torch.profiler, self CPU): {total:.0f} ms/step"]
    lines += [f"  {k:<28}{v:>9.1f} ms{v / total:>8.1%}" for k, v in ops["groups_ms"].items()]
    lines.append(f"  {'top operators':<44}{'ms/step':>9}{'share':>8}{'calls/step':>12}")
    for o in ops["top"]:
        name = o["op"] if len(o["op"]) <= 44 else o["op"][:41] + "..."
        lines.append(
            f"  {name:<44}{o['ms_per_step']:>9.1f}{o['share']:>8.1%}{o['calls_per_step']:>12.0f}"
        )
    return "\n".join(lines)


def format_table(res: dict) -> str:
    p, prof = res["params"], res["profiled"]
    lines = [
        f"GRPO step, P={p['prompts']} G={p['group_size']} max_new_tokens={p['max_new_tokens']}"
        f"{' (full length)' if p.get('full_length') else ''}, "
        f"{res['model_parameters'] / 1e6:.2f}M-parameter tiny Qwen2, {p['threads']} thread(s)",
        f"plain run: {res['plain']['step_ms']:.0f} ms/step (rollout "
        f"{res['plain']['rollout_ms']:.0f}, update {res['plain']['update_ms']:.0f}; "
        f"{res['plain']['generated_tokens']:.0f} tokens generated/step)",
        f"profiled: {prof['step_ms']:.0f} ms/step",
        f"{'part':<26}{'ms/step':>9}{'share':>8}",
    ]
    for k, v in prof["parts_ms"].items():
        lines.append(f"{k:<26}{v:>9.1f}{prof['share'][k]:>8.1%}")
    lines.append(f"generation per generated token: {prof['generation_ms_per_token']:.2f} ms")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="default", help="rlpost.llm.model.tiny size preset")
    ap.add_argument(
        "--full-length", action="store_true", help="every response runs to --max-new-tokens"
    )
    ap.add_argument(
        "--reward", choices=["exact", "digits"], default="exact",
        help="as tools/bench_llm_grpo.py: exact (the untrained model scores 0, every row "
        "inert and skipped) or digits (dense: the update does its work)",
    )  # fmt: skip
    ap.add_argument("--ops", action="store_true", help="an operator table too (torch.profiler)")
    ap.add_argument("--out", default="bench_results/llm_grpo_profile.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        spec = {
            "prompts": a.prompts, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens,
            "steps": a.steps, "warmup": a.warmup, "threads": a.threads, "seed": a.seed,
            "size": a.size, "work": work, "temperature": 1.0, "lr": 1e-4,
            "mask_truncated": False, "full_length": a.full_length, "reward": a.reward,
        }  # fmt: skip
        res = run(spec)
        if a.ops:
            res["ops"] = op_table(spec)
    print(format_table(res))
    if "ops" in res:
        print(format_ops(res["ops"]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
