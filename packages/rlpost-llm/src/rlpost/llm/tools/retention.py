"""Value retention across post-training (001-25's study as a tool): ``rlpost-llm retention``.

A probe set is held-out behaviour the base model has and post-training should not
destroy: here, tasks (``task`` or ``task:{params}``), each answered greedily and verified
by its own task. For every run given, each kept checkpoint (and the run's initial
weights, step 0) is probed, so the table shows how each probe's accuracy moves as each
run's training data moves the model. Two runs from the same base on different data are
the study's comparison: which post-training domain preserves which behaviour. The
result is ``retention.json`` and a plot, one panel per probe, one line per run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from rlpost.llm.data.tasks import make_task
from rlpost.llm.tools.weights import checkpoint_steps


def parse_probe(spec: str) -> tuple[str, dict]:
    """``"arithmetic"`` or ``"arithmetic:{digits: 1}"``: the task and its parameters."""
    import yaml

    name, _, params = spec.partition(":")
    parsed = yaml.safe_load(params) if params else {}
    if not isinstance(parsed, dict):
        raise ValueError(
            f"probe {spec!r}: parameters must be a mapping, e.g. arithmetic:{{digits: 1}}"
        )
    make_task(name, **parsed)  # (an unknown task or parameter: one line)
    return name, parsed


def probe_accuracy(model: Any, tok: Any, examples: list, task: Any, max_new_tokens: int) -> float:
    """Greedy accuracy of ``model`` on ``examples``, verified by ``task``."""
    from rlpost.llm.data.prompts import encode_prompt
    from rlpost.llm.rollout.engines import make_local_engine
    from rlpost.llm.rollout.engines.base import SamplingParams

    engine = make_local_engine("auto", model, tok)
    batch = engine.generate([encode_prompt(tok, e.prompt) for e in examples], 1,
                            SamplingParams(max_new_tokens, 0.0))  # fmt: skip
    texts = batch.texts(tok)
    return sum(task.accuracy(x, e) for x, e in zip(texts, examples, strict=True)) / len(examples)


def retention(runs: list[str | Path], probes: list[str], out: str | Path, size: int = 256) -> dict:
    """Every probe's accuracy at every kept checkpoint of every run (step 0: the run's
    initial weights); written to ``out/retention.json`` and ``out/retention.png``."""
    from safetensors.torch import load_model

    from rlpost.llm.tools.weights import run_base

    sets = []
    for i, spec in enumerate(probes):
        name, params = parse_probe(spec)
        task = make_task(name, **params)
        sets.append((spec, task, task.sample(size, random.Random(50_000 + i))))
    table: dict = {"probes": probes, "runs": {}}
    for run in runs:
        cfg, model, tok = run_base(Path(run), "retention")
        n = cfg.rollout.max_new_tokens
        rows = [{"step": 0, **{s: probe_accuracy(model, tok, ex, t, n) for s, t, ex in sets}}]
        for step, folder in checkpoint_steps(Path(run)):
            load_model(model, str(folder / "model.safetensors"), strict=True)
            rows.append(
                {"step": step, **{s: probe_accuracy(model, tok, ex, t, n) for s, t, ex in sets}}
            )
        table["runs"][str(run)] = rows
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "retention.json").write_text(json.dumps(table, indent=1))
    _plot(table, out / "retention.png")
    return table


def _plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probes = table["probes"]
    fig, axes = plt.subplots(1, len(probes), figsize=(4 * len(probes), 3), squeeze=False)
    for ax, probe in zip(axes[0], probes, strict=True):
        for run, rows in table["runs"].items():
            ax.plot([r["step"] for r in rows], [r[probe] for r in rows], marker="o", ms=3,
                    label=Path(run).name)  # fmt: skip
        ax.set(title=probe, xlabel="step", ylabel="held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
