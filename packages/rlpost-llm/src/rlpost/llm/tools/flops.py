"""``rlpost-llm flops RUN [RUN ...]``: where each finished run's compute went (RACE,
004-01), and, over several runs (a pilot grid: model sizes, group sizes, steps, reward
systems), which allocation bought the most held-out accuracy per FLOP.

Reads each run's ``metrics.jsonl``: the ``flops/total/*`` totals of its last row (the
``flops`` step hook, :mod:`rlpost.llm.train.hooks.flops`) and its evaluations. RACE's
caveat holds: a pilot grid is a diagnostic of allocation regimes, not a guarantee of
held-out improvement at the full budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.core.io.metrics import read_metrics

PARTS = ("rollout", "update", "feedback")


def run_split(run: str | Path) -> dict[str, Any]:
    """One run's FLOP totals, their shares, and its held-out accuracy before and after."""
    rows = read_metrics(Path(run))
    if not rows:
        raise FileNotFoundError(f"{run}: no metrics.jsonl rows (not a finished rlpost-llm run)")
    last = next((r for r in reversed(rows) if "flops/total" in r), None)
    if last is None:
        raise ValueError(f"{run}: no FLOP totals in its metrics (a run with run.flops=false?)")
    total = last["flops/total"]
    ev = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    out: dict[str, Any] = {"run": str(run), "steps": max(r["step"] for r in rows)}
    for p in PARTS:
        out[p] = last.get(f"flops/total/{p}", 0.0)
        out[f"{p}_share"] = out[p] / total if total else 0.0
    out["eval_flops"] = last.get("flops/total/eval", 0.0)
    out["total"] = total
    out["eval_before"], out["eval_after"] = (ev[0], ev[-1]) if ev else (None, None)
    gain = out["eval_after"] - out["eval_before"] if ev else None
    out["gain_per_pflop"] = gain / (total / 1e15) if gain is not None and total else None
    return out


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def report(runs: list[str | Path]) -> str:
    """The split of each run, and (several runs) the one with the most accuracy gained
    per FLOP: RACE's pilot-grid view."""
    splits = [run_split(r) for r in runs]
    head = (f"{'run':<28} {'steps':>5} {'total FLOPs':>12} {'rollout':>8} {'update':>7} "
            f"{'feedback':>8} {'eval acc':>13} {'gain/PFLOP':>10}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for s in splits:
        acc = "" if s["eval_after"] is None else f"{s['eval_before']:.3f}->{s['eval_after']:.3f}"
        g = "" if s["gain_per_pflop"] is None else f"{s['gain_per_pflop']:.3g}"
        lines.append(
            f"{Path(s['run']).name[:28]:<28} {s['steps']:>5} {_si(s['total']) + 'FLOP':>12} "
            f"{s['rollout_share']:>8.1%} {s['update_share']:>7.1%} {s['feedback_share']:>8.1%} "
            f"{acc:>13} {g:>10}"
        )
    lines.append(
        "evaluation (not in the total): "
        + ", ".join(f"{Path(s['run']).name}: {_si(s['eval_flops'])}FLOP" for s in splits)
    )
    ranked = [s for s in splits if s["gain_per_pflop"] is not None]
    if len(ranked) > 1:
        best = max(ranked, key=lambda s: s["gain_per_pflop"])
        top = max(ranked, key=lambda s: s["eval_after"])
        lines.append(
            f"most accuracy per FLOP: {Path(best['run']).name} "
            f"({best['gain_per_pflop']:.3g} per PFLOP); highest accuracy: "
            f"{Path(top['run']).name} ({top['eval_after']:.3f} at {_si(top['total'])}FLOP). "
            "A pilot grid shows allocation regimes, not what the full budget will reach."
        )
    return "\n".join(lines)
