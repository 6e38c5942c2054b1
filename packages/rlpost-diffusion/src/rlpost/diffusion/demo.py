"""The ``rlpost-diffusion demo`` job: RAM vs Flow-GRPO on the embedded digits model.

Builds (or loads from the cache) the class-conditional flow-matching base and the reward
classifier, trains RAM and Flow-GRPO from the same base on the same reward and batch
size, and writes into ``out``:

* ``samples.png``: one row per class, the same eval noise before and after each method;
* ``samples_before.png`` / ``samples_after_<method>.png``: the full eval grids;
* ``reward_curves.png``: eval reward and class accuracy vs step for both methods;
* ``demo.json`` and the printed table: reward / accuracy before and after, the first
  step at which each method reaches Flow-GRPO's best eval reward, the velocity-norm
  ratio, and wall time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlpost.diffusion.config import load_config
from rlpost.diffusion.recipes import recipe_path
from rlpost.diffusion.runlog import save_comparison


def steps_to_reach(rows: list[dict[str, Any]], key: str, level: float) -> int | None:
    """First logged step whose ``key`` is >= ``level`` (None if never)."""
    for r in rows:
        if key in r and r[key] >= level - 1e-9:
            return int(r["step"])
    return None


def plot_comparison(runs: dict[str, list[dict[str, Any]]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (key, label), ax in zip(
        [
            ("eval/reward", "eval reward (ODE, fixed noise)"),
            ("eval/class_accuracy", "class accuracy"),
        ],
        axes,
        strict=True,
    ):
        for name, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", ms=3, lw=1.3, label=name)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


PEAK_REFERENCE = "flow_grpo"  # the method whose peak reward the others' speed is measured to


def run_demo(
    out: str | Path = "runs/diffusion-demo",
    steps: int | None = None,
    reward: str | None = None,
    methods: tuple[str, ...] = ("ram", "flow_grpo"),
    progress: bool = True,
    extra_overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Run the demo; returns the table rows (also written to ``out/demo.json``)."""
    from rlpost.diffusion.trainer import Trainer

    out = Path(out)
    configs = {}  # all validated before anything is written
    for method in methods:
        overrides = [f"run.dir={out / method}", f"run.progress={progress}"]
        if steps is not None:
            overrides.append(f"train.steps={steps}")
        if reward is not None:
            overrides.append(f"reward.name={reward}")
        configs[method] = load_config(
            recipe_path(f"{method}_digits"), overrides + (extra_overrides or [])
        )
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    timing: dict[str, float] = {}
    columns: dict[str, Any] = {}
    for method, cfg in configs.items():
        t0 = time.perf_counter()
        trainer = Trainer(cfg)
        runs[method] = trainer.train(overwrite=True)  # the demo replaces its own runs
        timing[method] = time.perf_counter() - t0
        columns.setdefault("before", trainer.eval_images["first"])
        columns[f"after {method}"] = trainer.eval_images["last"]
        eval_prompts = [p for p in cfg.prompts.prompts for _ in range(cfg.run.eval_per_prompt)]
        per_prompt = cfg.run.eval_per_prompt
        src = out / method / "samples_after.png"
        if src.exists():
            src.replace(out / f"samples_after_{method}.png")
        before = out / method / "samples_before.png"
        if before.exists():
            before.replace(out / "samples_before.png")
    plot_comparison(runs, out / "reward_curves.png")
    save_comparison(columns, eval_prompts, out / "samples.png", per_prompt, show=min(4, per_prompt))
    peak_source = PEAK_REFERENCE if PEAK_REFERENCE in runs else methods[0]
    peak = max(r["eval/reward"] for r in runs[peak_source] if "eval/reward" in r)
    table = []
    for name, rows in runs.items():
        evals = [r for r in rows if "eval/reward" in r]
        table.append(
            {
                "method": name,
                "reward_before": evals[0]["eval/reward"],
                "reward_after": evals[-1]["eval/reward"],
                "reward_best": max(r["eval/reward"] for r in evals),
                "accuracy_before": evals[0].get("eval/class_accuracy"),
                "accuracy_after": evals[-1].get("eval/class_accuracy"),
                "vnorm_ratio_after": evals[-1]["eval/vnorm_ratio"],
                f"steps_to_{peak_source}_peak": steps_to_reach(rows, "eval/reward", peak),
                "seconds": round(timing[name], 1),
            }
        )
    result = {"peak_source": peak_source, "peak_reward": peak, "rows": table}
    (out / "demo.json").write_text(json.dumps(result, indent=1))
    return result


def format_table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    key = f"steps_to_{result['peak_source']}_peak"
    head = (
        f"{'method':<11}{'reward':>16}{'best':>8}{'class acc':>16}"
        f"{'|v|/|v_ref|':>13}{'steps to peak':>15}{'time':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = (
            f"{r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f}"
            if r["accuracy_before"] is not None
            else "-"
        )
        reach = r[key] if r[key] is not None else "never"
        lines.append(
            f"{r['method']:<11}{r['reward_before']:>7.3f} -> {r['reward_after']:.3f}"
            f"{r['reward_best']:>8.3f}{acc:>16}{r['vnorm_ratio_after']:>13.3f}"
            f"{reach!s:>15}{r['seconds']:>7.0f}s"
        )
    lines.append(
        f"peak = best eval reward of {result['peak_source']} ({result['peak_reward']:.3f})"
    )
    return "\n".join(lines)
