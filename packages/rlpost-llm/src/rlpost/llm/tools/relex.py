"""RELEX (000-12) on a run's checkpoints: ``rlpost-llm relex``.

The run's checkpoints up to ``upto`` (``checkpoints/step-XXXXXX``, the trainer's
``model.safetensors``) are the observation window; the run's initial weights (its
``config.yaml``'s ``model.path``) are step 0. Each floating-point tensor's deltas get their
own rank-1 direction and coefficient line (:func:`rlpost.core.extrapolate.fit`); each
target step's extrapolated weights are written as a checkpoint folder that loads with
``AutoModelForCausalLM.from_pretrained`` (and with ``rlpost-llm eval --checkpoint``), and
``relex.json`` reports the window, the share of the deltas' energy the rank-1 directions
hold per tensor and overall, and each tensor's line fit (R^2).

A run must keep enough checkpoints: ``run.save_every`` small enough and
``run.keep_checkpoints`` large enough for at least two inside the window. A LoRA run is
refused (its factors' product is not linear in them): export merged checkpoints first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rlpost.core.extrapolate import Rank1Fit, fit, overall_energy
from rlpost.llm.tools.weights import checkpoint_steps, run_base, save_folder


def fit_run(run_dir: Path, upto: int) -> tuple[Any, Any, Any, dict[str, Rank1Fit], dict]:
    """The run's config, initial model and tokenizer, each float tensor's rank-1 fit over
    the checkpoints up to ``upto``, and the report."""
    from safetensors.torch import load_file

    cfg, model, tok = run_base(run_dir, "relex")
    window = [(s, p) for s, p in checkpoint_steps(run_dir) if s <= upto]
    if len(window) < 2:
        raise ValueError(
            f"relex: {run_dir}: {len(window)} checkpoint(s) up to step {upto}; need at least 2 "
            "(train with a smaller run.save_every and a larger run.keep_checkpoints)"
        )
    base = model.state_dict()
    loaded = [load_file(str(p / "model.safetensors")) for _, p in window]
    steps = torch.tensor([0.0] + [float(s) for s, _ in window])
    fits, norms = {}, {}
    for name in loaded[0]:
        t0 = base[name]
        if not t0.is_floating_point():
            continue
        d = torch.stack([torch.zeros_like(t0)] + [sd[name] - t0 for sd in loaded]).flatten(1)
        fits[name] = fit(d.float(), steps)
        norms[name] = float((d.double() ** 2).sum())
    report = {
        "run": str(run_dir),
        "observed_steps": [s for s, _ in window],
        "energy": overall_energy(fits, norms),
        "tensors": {k: {"energy": f.energy, "r2": f.r2, "slope": f.slope} for k, f in fits.items()},
    }
    return cfg, model, tok, fits, report


def write_extrapolated(
    model: Any, tok: Any, fits: dict[str, Rank1Fit], step: int, out: Path
) -> Path:
    """The model at ``step`` along the fits (``theta_0 + (a + b step) v`` per tensor) as a
    checkpoint folder that ``from_pretrained`` loads."""
    base = model.state_dict()
    moved = {k: base[k] + f.at(step).view_as(base[k]).to(base[k].dtype) for k, f in fits.items()}
    return save_folder(model, tok, moved, Path(out) / f"step-{step:06d}")


def relex(run_dir: str | Path, upto: int, targets: list[int], out: str | Path) -> dict:
    """Fit the window, write each target step's checkpoint under ``out``, and
    ``out/relex.json``; returns the report."""
    _, model, tok, fits, report = fit_run(Path(run_dir), upto)
    report["written"] = {str(t): str(write_extrapolated(model, tok, fits, t, Path(out)))
                         for t in targets}  # fmt: skip
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "relex.json").write_text(json.dumps(report, indent=1))
    return report


def evaluate_written(run_dir: str | Path, report: dict) -> str:
    """A table: each written step's held-out greedy accuracy, beside the run's own
    checkpoint at that step where it was kept."""
    from rlpost.llm.config import load_config
    from rlpost.llm.tools.evaluate import evaluate_config

    cfg = load_config(str(Path(run_dir) / "config.yaml"), ["reward.workers=0"])
    real = dict(checkpoint_steps(Path(run_dir)))
    lines = ["step  relex  run's checkpoint"]
    for step, folder in report["written"].items():
        acc = evaluate_config(cfg, folder)["greedy_accuracy"]
        own = real.get(int(step))
        mine = f"{evaluate_config(cfg, str(own))['greedy_accuracy']:.3f}" if own else "-"
        lines.append(f"{int(step):>4}  {acc:.3f}  {mine}")
    return "\n".join(lines)
