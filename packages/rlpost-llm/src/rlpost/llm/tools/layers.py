"""Layer contribution (004-23): how much of full RL's gain each transformer layer reaches
when it alone is trained, on the same budget: ``rlpost-llm layers``.

For a config, the tool trains the full model (every weight), then each decoder layer
alone (``model.train_layers=[i]``: every other weight frozen), every run the same steps,
prompts and samples, and evaluates each on the held-out set. A layer's contribution is
its share of the full run's gain, ``(acc_i - acc_0) / (acc_full - acc_0)``: 1 when the
layer alone reaches the full gain, 0 when it gains nothing, below 0 when it loses
accuracy; undefined (``None``) when full RL gains nothing. The table and a bar plot are
written to ``out`` (``layers.json``, ``layers.png``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def contribution(base: float, full: float, layer: float) -> float | None:
    """A layer's share of the full run's gain (None: the full run gained nothing)."""
    gain = full - base
    return (layer - base) / gain if gain > 1e-12 else None


def layer_contribution(config: str | None, overrides: list[str], out: str | Path) -> list[dict]:
    """Train the full model and every layer alone under ``config`` + ``overrides``; the
    rows of the table (written with a plot under ``out``)."""
    from rlpost.llm.config import load_config
    from rlpost.llm.tools.runlog import read_metrics
    from rlpost.llm.trainer import Trainer

    out = Path(out)
    cfg = load_config(config, [*overrides, f"run.dir={out / 'full'}"])
    n_layers = _n_layers(cfg)
    runs = {"full": []} | {f"layer {i}": [f"model.train_layers=[{i}]"] for i in range(n_layers)}
    rows, base = [], None
    steps = cfg.train_steps()
    for name, extra in runs.items():
        run_dir = out / name.replace(" ", "-")
        c = load_config(config, [*overrides, *extra, f"run.dir={run_dir}",
                                 f"run.eval_every={steps}"])  # fmt: skip
        Trainer(c).train()
        ev = [r["eval/accuracy"] for r in read_metrics(run_dir) if "eval/accuracy" in r]
        base = ev[0] if base is None else base
        rows.append({"run": name, "heldout_before": ev[0], "heldout_after": ev[-1]})
    full = rows[0]["heldout_after"]
    for r in rows:
        r["share_of_full_gain"] = contribution(base, full, r["heldout_after"])
    (out / "layers.json").write_text(json.dumps(rows, indent=1))
    plot_shares(rows, out / "layers.png")
    return rows


def _n_layers(cfg: Any) -> int:
    from rlpost.llm.model.policy import load_policy

    model, _ = load_policy(cfg, progress=False)
    return int(model.config.num_hidden_layers)


def plot_shares(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["run"] for r in rows[1:]]
    shares = [r["share_of_full_gain"] or 0.0 for r in rows[1:]]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(names, shares)
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="full RL")
    ax.set(ylabel="share of full RL's gain", title="one layer trained alone, same budget")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
