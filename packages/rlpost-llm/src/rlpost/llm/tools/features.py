"""Feature-level analysis of post-training (catalog 001-30's study as a tool):
``rlpost-llm features``.

Given a base model and runs tuned from it (an RL run and an SFT run on the same data,
say), the tool reads every model's residual stream after one decoder layer on the same
inputs (each probe task's prompts with their reference answers), fits one top-k sparse
autoencoder to the base's and the final tuned models' activations together, and compares
the models in that shared feature space (:mod:`rlpost.core.features`):

* per run, at every kept checkpoint: features new, lost and changed against the base,
  the mean drift, and the drift from the previous checkpoint (do the changes settle early,
  or keep moving?);
* the mediators: on the examples the final tuned model answers right and the base wrong,
  the ``top`` features that fire most above the base; the probes' greedy accuracy of the
  tuned model with them disabled (and, as the control, as many random live features
  disabled), and of the base with them amplified (``gamma``).

The result is ``features.json`` and a plot of the trajectories.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.llm.tools.retention import parse_probe


def run_points(path: Path) -> list[tuple[int, Path]]:
    """``(step, weights file)`` of a run's kept checkpoints, or ``[(0, file)]`` of a folder."""
    from rlpost.llm.tools.weights import checkpoint_steps

    if (path / "checkpoints").is_dir():
        points = [(s, f / "model.safetensors") for s, f in checkpoint_steps(path)]
    elif (path / "model.safetensors").is_file():
        points = [(0, path / "model.safetensors")]
    else:
        points = []
    if not points:
        raise ValueError(f"features: {path}: neither a run with checkpoints nor a model folder")
    return points


@torch.inference_mode()
def activations(model: Any, tok: Any, texts: list[str], layer: int) -> tuple[Tensor, Tensor]:
    """``([tokens, d], [tokens])``: the residual stream after decoder layer ``layer`` (as
    the next layer receives it: after any steering) at every real token of ``texts``, and
    the index of the text each token belongs to."""
    rows, owner = [], []

    def keep(h: Tensor) -> Tensor:
        rows.append(h[0].float().clone())
        return h

    with steered(model, layer, keep):
        for i, text in enumerate(texts):
            ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
            model(input_ids=ids, use_cache=False)
            owner += [i] * ids.shape[1]
    return torch.cat(rows), torch.tensor(owner)


@contextmanager
def steered(model: Any, layer: int, fn: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """``model`` with decoder layer ``layer``'s output hidden state replaced by ``fn(h)``."""

    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (fn(output[0]), *output[1:])
        return fn(output)

    handle = model.get_decoder().layers[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class Study:
    """The models, inputs and shared feature space of one analysis."""

    def __init__(self, base: Path, probes: list[str], layer: int | None, size: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlpost.llm.data.tasks import make_task

        if not (base / "config.json").is_file():
            raise ValueError(f"features: --base {base}: not a model folder (no config.json)")
        self.model = AutoModelForCausalLM.from_pretrained(base).eval()
        self.tok = AutoTokenizer.from_pretrained(base)
        self.base_state = {k: v.clone() for k, v in self.model.state_dict().items()}
        n_layers = self.model.config.num_hidden_layers
        self.layer = n_layers // 2 if layer is None else layer
        if not 0 <= self.layer < n_layers:
            raise ValueError(f"features: layer {self.layer} is not in 0..{n_layers - 1}")
        self.sets = []
        for i, spec in enumerate(probes):
            name, params = parse_probe(spec)
            task = make_task(name, **params)
            self.sets.append((spec, task, task.sample(size, random.Random(70_000 + i))))
        self.texts = [e.prompt + e.answer for _, _, ex in self.sets for e in ex]
        lengths = [len(ids) for ids in self.tok(self.texts, add_special_tokens=False).input_ids]
        self.owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        self._acts: dict[Path | None, Tensor] = {}

    def load(self, weights: Path | None) -> None:
        """The base's weights, then (when given) a checkpoint's on top."""
        from safetensors.torch import load_model

        self.model.load_state_dict(self.base_state)
        if weights is not None:
            load_model(self.model, str(weights), strict=False)

    def acts(self, weights: Path | None) -> Tensor:
        """The layer's activations of a checkpoint (the base's: None), read once each."""
        if weights not in self._acts:
            self.load(weights)
            self._acts[weights] = activations(self.model, self.tok, self.texts, self.layer)[0]
        return self._acts[weights]

    def scores(self, weights: Path | None, fn: Callable | None = None) -> list[list[float]]:
        """Per probe, each example's greedy score (with ``fn`` steering the layer)."""
        from rlpost.llm.model.tiny import greedy_scores

        self.load(weights)
        with steered(self.model, self.layer, fn) if fn else _nothing():
            return [greedy_scores(self.model, self.tok, t, ex) for _, t, ex in self.sets]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def feature_study(
    base: str | Path, runs: list[str | Path], probes: list[str], out: str | Path,
    layer: int | None = None, features: int = 512, k: int = 16, size: int = 128,
    top: int = 8, gamma: float = 2.0, sae_steps: int = 2000, seed: int = 0,
) -> dict:  # fmt: skip
    """The analysis the module describes; written to ``out/features.json`` with a plot."""
    from rlpost.core.features import train_sae

    points = {str(r): run_points(Path(r)) for r in runs}  # (checked before any loading)
    st = Study(Path(base), probes, layer, size)
    base_acts = st.acts(None)
    finals = {r: st.acts(p[-1][1]) for r, p in points.items()}
    sae, unexplained = train_sae(torch.cat([base_acts, *finals.values()]), features, k,
                                 steps=sae_steps, seed=seed)  # fmt: skip
    sae.requires_grad_(False)
    codes = sae.encode(base_acts)
    report: dict = {"layer": st.layer, "features": features, "k": k, "probes": probes,
                    "unexplained_variance": unexplained, "runs": {}}  # fmt: skip
    base_scores = st.scores(None)
    for run, pts in points.items():
        report["runs"][run] = {
            "trajectory": trajectory(st, sae, codes, pts),
            **interventions(st, sae, codes, pts[-1][1], base_scores, top, gamma, seed),
        }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "features.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "features.png")
    return report


def trajectory(st: Study, sae: Any, codes: Tensor, points: list) -> list[dict]:
    """Every checkpoint's change against the base, and its drift from the previous one."""
    from rlpost.core.features import feature_change

    rows, prev = [], codes
    for step, weights in points:
        now = sae.encode(st.acts(weights))
        rows.append({"step": step, **feature_change(codes, now).summary(),
                     "drift_from_previous": feature_change(prev, now).summary()["mean_drift"]})  # fmt: skip
        prev = now
    return rows


def interventions(
    st: Study, sae: Any, codes: Tensor, final: Path, base_scores: list, top: int,
    gamma: float, seed: int,
) -> dict:  # fmt: skip
    """The mediators of the tuned model's wins over the base, and what steering them does."""
    from rlpost.core.features import mediators, steer

    tuned = st.scores(final)
    flat_t = [s for p in tuned for s in p]
    flat_b = [s for p in base_scores for s in p]
    wins = [i for i, (t, b) in enumerate(zip(flat_t, flat_b, strict=True)) if t > b]
    tuned_codes = sae.encode(st.acts(final))
    rows = torch.isin(st.owner, torch.tensor(wins, dtype=torch.long))
    if not wins:
        return {"wins": 0, "mediators": [], "accuracy": _means({"base": base_scores,
                                                                "tuned": tuned})}  # fmt: skip
    med = mediators(codes[rows], tuned_codes[rows], top)
    live = torch.nonzero((tuned_codes > 0).any(0)).flatten()
    g = torch.Generator().manual_seed(seed)
    rand = live[torch.randperm(len(live), generator=g)[: len(med)]]
    acc = {
        "base": base_scores,
        "tuned": tuned,
        "tuned, mediators off": st.scores(final, lambda h: steer(h, sae, med, 0.0)),
        "tuned, random features off": st.scores(final, lambda h: steer(h, sae, rand, 0.0)),
        f"base, mediators x{gamma:g}": st.scores(None, lambda h: steer(h, sae, med, gamma)),
    }
    return {"wins": len(wins), "mediators": med.tolist(), "accuracy": _means(acc)}


def _means(acc: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    return {name: [sum(s) / len(s) for s in per_probe] for name, per_probe in acc.items()}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    for run, r in report["runs"].items():
        t = r["trajectory"]
        steps = [p["step"] for p in t]
        for ax, key in zip(axes, ("changed", "new", "drift_from_previous"), strict=True):
            ax.plot(steps, [p[key] for p in t], marker="o", ms=3, label=Path(run).name)
    for ax, title in zip(axes, ("features changed vs base", "features new vs base",
                                "mean drift from previous checkpoint"), strict=True):  # fmt: skip
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
