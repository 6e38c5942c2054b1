"""The value-gradient view (catalog 000-11's study as a tool): ``rlpost-llm value-gradient``.

For each model given (a model folder, or a run: its initial weights and every kept
checkpoint), the tool samples ``samples`` responses to each of ``prompts`` fixed prompts
of the config's task, scores them with the task, and measures the two factors into which
the paper decomposes what RL can do for that model (:mod:`rlpost.core.value_gradient`):

* the value-gradient signal: the root mean square over prompts of ``||grad J(x)||``, each
  estimated without bias from the per-sample gradients of the prompt's samples (batched
  with ``torch.func``; a prompt whose samples all score alike contributes an exact zero);
  beside it the batch signal ``||E_x grad J(x)||`` (the direction the prompts share),
  the per-prompt noise and their ratio;
* the reachable reward headroom: the best of a prompt's samples minus their mean.

Their product is the criterion; run on the checkpoints of a pre-training trajectory it says
where RL should help most. The table is written to ``out/value_gradient.json`` with a plot.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from rlpost.llm.data.tasks import make_task


def sources(paths: list[str | Path]) -> list[tuple[str, Any, Path]]:
    """``(label, load, where)`` per model: a folder's model, or a run's initial weights and
    its kept checkpoints (``load(model)`` loads the weights into the run's model)."""
    from safetensors.torch import load_model

    from rlpost.llm.tools.weights import checkpoint_steps

    out: list[tuple[str, Any, Path]] = []
    for p in map(Path, paths):
        if (p / "config.yaml").is_file():
            out.append((f"{p.name}@0", None, p))
            for step, folder in checkpoint_steps(p):
                file = str(folder / "model.safetensors")
                out.append((f"{p.name}@{step}", lambda m, f=file: load_model(m, f), p))
        elif (p / "config.json").is_file():
            out.append((p.name, None, p))
        else:
            raise ValueError(f"value-gradient: {p}: neither a run directory nor a model folder")
    return out


def _model(where: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a run's initial ones, or a folder's (``from_pretrained``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.llm.tools.weights import run_base

    if (where / "config.yaml").is_file():
        _, model, tok = run_base(where, "value-gradient")
        return model, tok
    return AutoModelForCausalLM.from_pretrained(where), AutoTokenizer.from_pretrained(where)


def value_gradient(
    paths: list[str | Path],
    cfg: Any,
    out: str | Path,
    prompts: int = 64,
    samples: int = 8,
    seed: int = 0,
) -> list[dict]:
    """The signal, headroom and criterion of every model in ``paths`` on ``cfg``'s task
    (the same ``prompts`` prompts, ``samples`` responses each, at the rollout temperature);
    the rows of the table (written with a plot under ``out``)."""
    task = make_task(cfg.data.task, **cfg.data.task_params)
    examples = task.sample(prompts, random.Random(60_000 + seed))
    rows, loaded = [], None
    for label, load, where in sources(paths):
        if loaded is None or loaded[0] != where:
            loaded = (where, *_model(where))
        _, model, tok = loaded
        if load is not None:
            load(model)
        torch.manual_seed(seed)
        rows.append({"model": label, **measure(model, tok, task, examples, samples, cfg)})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "value_gradient.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "value_gradient.png")
    return rows


def measure(model: Any, tok: Any, task: Any, examples: list, k: int, cfg: Any) -> dict:
    """Sample ``k`` responses per example and measure the signals and the headroom."""
    from rlpost.core.value_gradient import GradientMoments, criterion, headroom, loo_weights
    from rlpost.llm.data.prompts import encode_prompt
    from rlpost.llm.rollout.engines import make_local_engine
    from rlpost.llm.rollout.engines.base import SamplingParams

    temperature = cfg.rollout.temperature
    engine = make_local_engine("auto", model, tok)
    batch = engine.generate([encode_prompt(tok, e.prompt) for e in examples], k,
                            SamplingParams(cfg.rollout.max_new_tokens, temperature))  # fmt: skip
    texts = batch.texts(tok)
    rewards = torch.tensor(
        [task.score(texts[i], examples[i // k]) for i in range(len(texts))]
    ).view(len(examples), k)
    moments, own, entropy = GradientMoments(), [], []
    for p, w in enumerate(loo_weights(rewards)):
        g, sq, ent = prompt_signals(model, batch, range(p * k, (p + 1) * k), rewards[p], w,
                                    temperature)  # fmt: skip
        moments.add(g)
        own.append(sq)
        entropy.append(ent)
    signal_sq = sum(own) / len(own)
    row = {**headroom(rewards), "signal": max(signal_sq, 0.0) ** 0.5, "signal_sq": signal_sq}
    row |= {**moments.summary(), "entropy": sum(entropy) / len(entropy)}
    row["criterion"] = criterion(row["signal"], row["headroom"])
    return row


def prompt_signals(
    model: Any, batch: Any, rows: range, rewards: torch.Tensor, weights: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, float, float]:  # fmt: skip
    """One prompt's samples ``rows``: its leave-one-out gradient ``sum_i w_i grad log
    pi(y_i)`` (flattened, every trainable parameter), its unbiased ``||grad J(x)||^2`` and
    its mean token entropy. Rewards all alike: both are exact zeros, no backward pass."""
    from rlpost.core.value_gradient import prompt_signal_sq
    from rlpost.llm.model.per_sample import row_grads
    from rlpost.llm.model.policy import completion_logprobs, eval_mode, make_seq_batch

    idx = list(rows)
    mask = batch.mask[idx]
    sb = make_seq_batch([batch.prompt_ids[i] for i in idx], batch.completion_ids[idx], mask,
                        batch.pad_id)  # fmt: skip
    with torch.no_grad(), eval_mode(model):
        ent = completion_logprobs(model, sb, temperature)[1].float().cpu()
    entropy = float((ent * mask).sum() / mask.sum().clamp_min(1))
    if not bool(weights.ne(0).any()):
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return torch.zeros(n), 0.0, entropy
    (nll,) = row_grads(model, sb, mask, temperature, chunk=len(idx), mean=False)
    score = -nll.double()  # grad log pi(y_i | x), one row per sample
    return weights.double() @ score, prompt_signal_sq(rewards, score @ score.T), entropy


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3))
    for ax, key, title in zip(axes, ("signal", "headroom", "criterion"),
                              ("value-gradient signal ||E g||", "reachable headroom",
                               "criterion: signal x headroom"), strict=True):  # fmt: skip
        ax.plot(names, [r[key] for r in rows], marker="o")
        ax.set(title=title)
        ax.tick_params(axis="x", rotation=45)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
