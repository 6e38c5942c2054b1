"""Rollout traces: every trained row of every step in one JSONL stream, with an index.

``run.traces=true`` makes the trainer append, after each update, one line per row to
``run.dir/traces.jsonl``: the step, the row's group, its prompt (text or messages), the
reference answer, the completion, the reward (and each reward function's component),
the verifier's verdict, the advantage (the mean over the row's tokens), the weights
version that generated it, why it ended and its length. ``traces.index.jsonl`` holds one
line per step, ``{"step", "offset", "rows"}``, so a step is read with one seek however
long the run. A resumed run first cuts both files back to its checkpoint's step.

:func:`show_step` is ``rlpost-llm traces RUN``: a step's best and worst groups by mean
reward, each completion with its reward and advantage (prime-rl and verl's RL-Insight
offer the same view).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRACES, INDEX = "traces.jsonl", "traces.index.jsonl"


def _index(run_dir: Path) -> list[dict[str, int]]:
    """The index's entries (a line torn by a kill mid-write left out)."""
    from rlpost.core.io.metrics import step_rows

    return step_rows(run_dir / INDEX)


class TraceWriter:
    """Appends steps to a run's traces (see the module docstring)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._cut = False

    def cut_after(self, step: int) -> None:
        """Drop every step after ``step`` (a resumed run continues from its checkpoint)."""
        kept = [e for e in _index(self.run_dir) if e["step"] <= step]
        end = (kept[-1]["offset"] + kept[-1]["bytes"]) if kept else 0
        traces = self.run_dir / TRACES
        if traces.is_file() and traces.stat().st_size > end:
            with open(traces, "r+b") as f:
                f.truncate(end)
        (self.run_dir / INDEX).write_text("".join(json.dumps(e) + "\n" for e in kept))

    def write(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not self._cut:  # the first step this process writes: nothing after it survives
            self.cut_after(step - 1)
            self._cut = True
        data = "".join(json.dumps({"step": step, **r}, default=str) + "\n" for r in rows)
        payload = data.encode()
        traces = self.run_dir / TRACES
        with open(traces, "ab") as f:
            offset = f.tell()
            f.write(payload)
        entry = {"step": step, "offset": offset, "bytes": len(payload), "rows": len(rows)}
        with open(self.run_dir / INDEX, "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_step(run_dir: str | Path, step: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``step`` (default: the last traced step)."""
    run_dir = Path(run_dir)
    index = _index(run_dir)
    if not index:
        raise FileNotFoundError(
            f"{run_dir}: no rollout traces ({INDEX}); train with run.traces=true"
        )
    if step is None:
        entry = index[-1]
    else:
        found = [e for e in index if e["step"] == step]
        if not found:
            steps = [e["step"] for e in index]
            raise ValueError(f"{run_dir}: no traces of step {step}; traced: {steps[0]}-{steps[-1]}")
        entry = found[-1]
    with open(run_dir / TRACES, "rb") as f:
        f.seek(entry["offset"])
        data = f.read(entry["bytes"])
    return [json.loads(line) for line in data.decode().splitlines()]


def _text(x: Any, width: int) -> str:
    s = x if isinstance(x, str) else json.dumps(x)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 3] + "..."


def show_step(run_dir: str | Path, step: int | None = None, groups: int = 2,
              width: int = 60, rows_shown: int = 8) -> str:  # fmt: skip
    """A step's ``groups`` best and worst groups by mean reward, as text (of a larger
    group, its ``rows_shown`` highest- and lowest-rewarded completions)."""
    rows = read_step(run_dir, step)  # (named ``rows``: a step's trace lines)
    by_group: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    ranked = sorted(by_group.values(), key=lambda g: sum(r["reward"] for r in g) / len(g))
    n = min(groups, (len(ranked) + 1) // 2)
    picks = [("best", g) for g in ranked[::-1][:n]] + [("worst", g) for g in ranked[:n]]
    out = [f"step {rows[0]['step']}: {len(rows)} rows in {len(by_group)} groups"]
    for label, g in picks:
        mean = sum(r["reward"] for r in g) / len(g)
        first = g[0]
        out.append(
            f"\n{label} group {first['group']} (mean reward {mean:.3f}): "
            f"{_text(first['prompt'], width)}  answer {_text(first.get('answer'), 20)}"
        )
        out.append(f"  {'reward':>7} {'adv':>7} {'ver':>4} {'len':>4}  completion")
        ordered = sorted(g, key=lambda r: -r["reward"])
        half = max(1, rows_shown // 2)
        hidden = len(ordered) - 2 * half
        if hidden > 0:
            ordered = [*ordered[:half], None, *ordered[-half:]]
        for r in ordered:
            if r is None:
                out.append(f"  {'':>7} {'':>7} {'':>4} {'':>4}  ... {hidden} more")
                continue
            out.append(
                f"  {r['reward']:7.3f} {r['advantage']:7.3f} {r['version']:4d} {r['length']:4d}  "
                f"{_text(r['completion'], width)}"
            )
    return "\n".join(out)
