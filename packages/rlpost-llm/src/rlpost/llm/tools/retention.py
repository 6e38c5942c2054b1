"""Value retention across post-training (001-25's study as a tool): ``rlpost-llm retention``.

A probe set is held-out behaviour the base model has and post-training should not
destroy: here, tasks (``task`` or ``task:{params}``), each answered greedily and verified
by its own task. For every run given, each kept checkpoint (and the run's initial
weights, step 0) is probed, so the table shows how each probe's accuracy moves as each
run's training data moves the model. Two runs from the same base on different data are
the study's comparison: which post-training domain preserves which behaviour. The
result is ``retention.json`` and a plot, one panel per probe, one line per run.

Beside each probe's accuracy, every checkpoint's drift from the run's initial weights
(what SDPO's continual study, 004-20, measures): in parameter space, the relative norm
``||theta - theta_0|| / ||theta_0||``; in response space, per probe, the mean per-token
``KL(pi_theta || pi_0)`` over the full vocabulary at each token of the checkpoint's own
greedy answers.
"""

from __future__ import annotations

import copy
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


def greedy_answers(model: Any, tok: Any, examples: list, max_new_tokens: int) -> Any:
    """``model``'s greedy answers to ``examples`` (a ``RolloutBatch``)."""
    from rlpost.llm.data.prompts import encode_prompt
    from rlpost.llm.rollout.engines import make_local_engine
    from rlpost.llm.rollout.engines.base import SamplingParams

    engine = make_local_engine("auto", model, tok)
    return engine.generate([encode_prompt(tok, e.prompt) for e in examples], 1,
                           SamplingParams(max_new_tokens, 0.0))  # fmt: skip


def probe_accuracy(model: Any, tok: Any, examples: list, task: Any, max_new_tokens: int) -> float:
    """Greedy accuracy of ``model`` on ``examples``, verified by ``task``."""
    return _accuracy(greedy_answers(model, tok, examples, max_new_tokens), tok, examples, task)


def _accuracy(batch: Any, tok: Any, examples: list, task: Any) -> float:
    texts = batch.texts(tok)
    return sum(task.accuracy(x, e) for x, e in zip(texts, examples, strict=True)) / len(examples)


def param_drift(state: dict[str, Any], base: dict[str, Any]) -> float:
    """``||theta - theta_0|| / ||theta_0||`` over every floating-point tensor (float64)."""
    num = den = 0.0
    for k, b in base.items():
        if b.is_floating_point():
            b64 = b.double()
            num += float((state[k].double() - b64).square().sum())
            den += float(b64.square().sum())
    return (num / den) ** 0.5 if den else 0.0


def response_kl(model: Any, base: Any, batch: Any) -> float:
    """Mean per-token ``KL(model || base)`` over the full vocabulary at every generated
    token of ``batch`` (the distributions that produced each token, given the prompt and
    the answer so far). 0 when the batch generated nothing."""
    import torch

    rows, lengths = [], []
    for p, c, m in zip(batch.prompt_ids, batch.completion_ids, batch.mask, strict=True):
        n = int(m.sum())
        rows.append([*p, *c[:n].tolist()])
        lengths.append((len(p), n))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), batch.pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.double(), -1)
        logq = torch.log_softmax(base(input_ids=ids, attention_mask=attn).logits.double(), -1)
    total, count = 0.0, 0
    for i, (p, n) in enumerate(lengths):
        lp, lq = logp[i, p - 1 : p - 1 + n], logq[i, p - 1 : p - 1 + n]  # (predict each token)
        total += float((lp.exp() * (lp - lq)).sum())
        count += n
    return total / count if count else 0.0


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
        base = copy.deepcopy(model).eval()
        state0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
        n = cfg.rollout.max_new_tokens
        rows = [_probe_row(0, model, base, state0, tok, sets, n)]
        for step, folder in checkpoint_steps(Path(run)):
            load_model(model, str(folder / "model.safetensors"), strict=True)
            rows.append(_probe_row(step, model, base, state0, tok, sets, n))
        table["runs"][str(run)] = rows
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "retention.json").write_text(json.dumps(table, indent=1))
    _plot(table, out / "retention.png")
    return table


def _probe_row(step, model, base, state0, tok, sets, max_new_tokens) -> dict[str, float]:
    """One checkpoint's row: its drift, and each probe's accuracy and response KL."""
    out = {"step": step, "param_drift": param_drift(model.state_dict(), state0)}
    for spec, task, examples in sets:
        batch = greedy_answers(model, tok, examples, max_new_tokens)
        out[spec] = _accuracy(batch, tok, examples, task)
        out[f"{spec} kl"] = response_kl(model, base, batch)
    return out


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
