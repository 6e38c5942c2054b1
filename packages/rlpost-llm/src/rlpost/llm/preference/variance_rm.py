"""The anchor-guided variance-aware reward model (000-28) on a language model:
``rlpost-llm reward-model``, its use as a reward function and for best-of-N.

A sequence-classification head with two outputs on the policy's architecture
(``AutoModelForSequenceClassification``, ``num_labels=2``, TRL's reward-model convention
with a second output): ``mu`` and ``log sigma`` of the reward ``R(y) ~ N(mu, sigma^2)``
of ``prompt + completion``, trained with :func:`rlpost.core.variance_rm.variance_aware_loss`
on preference pairs (TRL's ``prompt`` / ``chosen`` / ``rejected`` columns, with an optional
``preference``: the share of judges preferring ``chosen``, 1 by default) and, where a row
has them, anchor labels (``chosen_anchors`` / ``rejected_anchors``: the shares above the
two thresholds, 0 and 1). ``--task arithmetic`` instead makes an embedded data set of
simulated judges on the task (:func:`synthetic_rows`). Saved with ``save_pretrained`` (it
loads back with ``AutoModelForSequenceClassification``), scored with
:class:`VarianceReward` (``mu - kappa sigma``), which is a reward function
``fn(completion, example)`` and picks best-of-N.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlpost.core.variance_rm import best_of_n, risk_adjusted, variance_aware_loss

THRESHOLDS = (0.0, 1.0)


@dataclass(frozen=True)
class RMRow:
    prompt: str
    chosen: str
    rejected: str
    preference: float = 1.0
    chosen_anchors: tuple[float, float] | None = None
    rejected_anchors: tuple[float, float] | None = None


# ---------------------------------------------------------------------- data
#: the simulated judges of :func:`synthetic_rows`: (mean, spread) of their rewards for an
#: answer of each style: the plain answer (all like it), the answer said twice (judges
#: split: the polarising style), the answer in brackets (all find it weak) and a
#: non-answer (in the tiny model's alphabet)
JUDGES = {"plain": (1.5, 0.3), "twice": (0.8, 1.2), "bracketed": (0.2, 0.3), "junk": (-1.5, 0.2)}


def _candidate(kind: str, answer: int, rng: random.Random) -> str:
    styles = {"plain": "{a}", "twice": "{a} {a}", "bracketed": "({a})"}
    if kind in styles:
        return styles[kind].format(a=answer)
    return rng.choice(("=", "+-", ":", ">>"))


def synthetic_rows(n: int, seed: int = 0, judges: int = 16) -> list[RMRow]:
    """``n`` pairs of answers to 2-digit additions, judged by ``judges`` simulated people
    whose rewards for an answer are ``N(mean, spread^2)`` of its style (:data:`JUDGES`:
    they disagree most about an answer said twice): the preference is the share preferring
    ``chosen``, the anchors the shares rating each answer above 0 and above 1."""
    rng = random.Random(seed)
    kinds = list(JUDGES)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        k1, k2 = rng.sample(kinds, 2)
        texts = [_candidate(k, a + b, rng) for k in (k1, k2)]
        draws = [[rng.gauss(*JUDGES[k]) for _ in range(judges)] for k in (k1, k2)]
        pref = sum(x > y for x, y in zip(*draws, strict=True)) / judges
        anchors = [tuple(sum(d > t for d in ds) / judges for t in THRESHOLDS) for ds in draws]
        rows.append(RMRow(f"{a}+{b}=", texts[0], texts[1], pref, anchors[0], anchors[1]))
    return rows


def load_rows(path: str | Path) -> list[RMRow]:
    """A JSON-lines preference file: TRL's columns, plus the optional ``preference``,
    ``chosen_anchors`` and ``rejected_anchors``; a bad row is named in one line."""
    from rlpost.core.io.config import ConfigError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"reward-model: no such file {path}")
    rows = []
    for i, line in enumerate(p.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            rows.append(RMRow(
                str(r["prompt"]), str(r["chosen"]), str(r["rejected"]),
                float(r.get("preference", 1.0)),
                tuple(r["chosen_anchors"]) if r.get("chosen_anchors") else None,
                tuple(r["rejected_anchors"]) if r.get("rejected_anchors") else None,
            ))  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"reward-model: {path} line {i + 1}: {type(exc).__name__}: {exc} (needs "
                "prompt, chosen, rejected; optional preference, chosen_anchors, rejected_anchors)"
            ) from None
    if not rows:
        raise ConfigError(f"reward-model: {path} holds no rows")
    return rows


# ---------------------------------------------------------------------- model
def load_model(path: str | Path) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a two-output sequence classifier from a causal LM's folder
    (a fresh head) or a saved reward model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=2)
    model.config.pad_token_id = tok.pad_token_id
    return model, tok


def heads(model: Any, tok: Any, prompts: list[str], completions: list[str]) -> tuple:
    """``(mu, log variance)`` of each ``prompt + completion`` (one forward)."""
    enc = tok([p + c for p, c in zip(prompts, completions, strict=True)], return_tensors="pt",
              padding=True, add_special_tokens=False)  # fmt: skip
    out = model(**enc).logits.float()
    return out[:, 0], 2 * out[:, 1]


def train_variance_rm(
    model: Any, tok: Any, rows: list[RMRow], steps: int = 200, batch_size: int = 32,
    lr: float = 3e-4, seed: int = 0, progress: bool = True,
) -> list[float]:  # fmt: skip
    """Adam on :func:`~rlpost.core.variance_rm.variance_aware_loss` over random batches of
    ``rows`` (anchors where rows have them); returns the losses."""
    from tqdm.auto import tqdm

    g = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="reward model", disable=not progress):
        batch = [rows[g.randrange(len(rows))] for _ in range(batch_size)]
        prompts = [r.prompt for r in batch]
        mu, lv = heads(
            model, tok, prompts * 2, [r.chosen for r in batch] + [r.rejected for r in batch]
        )
        n = len(batch)
        pref = torch.tensor([r.preference for r in batch])
        have = [i for i, r in enumerate(batch) if r.chosen_anchors and r.rejected_anchors]
        kw = {}
        if have:
            idx = torch.tensor(have + [n + i for i in have])
            labels = [batch[i].chosen_anchors for i in have] + [
                batch[i].rejected_anchors for i in have
            ]
            kw = {"anchor_mu": mu[idx], "anchor_logvar": lv[idx],
                  "anchor_labels": torch.tensor(labels), "thresholds": THRESHOLDS}  # fmt: skip
        loss = variance_aware_loss(mu[:n], lv[:n], mu[n:], lv[n:], pref, **kw)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def evaluate_rm(model: Any, tok: Any, rows: list[RMRow]) -> dict[str, float]:
    """Held-out pairwise accuracy (``mu`` orders the pair as most judges did) and the
    anchors' mean absolute calibration error."""
    mu, lv = heads(model, tok, [r.prompt for r in rows] * 2,
                   [r.chosen for r in rows] + [r.rejected for r in rows])  # fmt: skip
    n = len(rows)
    decided = [i for i, r in enumerate(rows) if r.preference != 0.5]
    right = [(mu[i] > mu[n + i]) == (rows[i].preference > 0.5) for i in decided]
    out = {"pair_accuracy": float(sum(right) / max(len(right), 1))}
    errs = []
    for i, r in enumerate(rows):
        for j, lab in ((i, r.chosen_anchors), (n + i, r.rejected_anchors)):
            if lab:
                sigma = math.exp(float(lv[j]) / 2)
                for t, share in zip(THRESHOLDS, lab, strict=True):
                    p = 0.5 * (1 + math.erf((float(mu[j]) - t) / (sigma * math.sqrt(2))))
                    errs.append(abs(p - share))
    if errs:
        out["anchor_abs_error"] = sum(errs) / len(errs)
    return out


def fit_reward_model(
    out: str | Path, data: str | None = None, model: str = "tiny", pairs: int = 2000,
    steps: int = 300, lr: float = 1e-3, seed: int = 0, progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """``rlpost-llm reward-model``: train on ``data`` (a preference file) or the embedded
    judges (``pairs`` of them, a tenth more held out), evaluate on the held-out tenth,
    save to ``out`` (``save_pretrained``) with ``reward_model.json`` (what it was fitted
    on and its evaluation). ``model``: ``tiny`` (the embedded base) or a causal LM's
    folder."""
    from rlpost.core.io.config import ConfigError

    torch.manual_seed(seed)
    if data is None:
        rows, held = synthetic_rows(pairs, seed), synthetic_rows(max(pairs // 10, 20), seed + 1)
    else:
        rows = load_rows(data)
        cut = max(1, len(rows) // 10) if len(rows) >= 10 else 0
        rows, held = rows[cut:], rows[:cut] or rows
    if model == "tiny":
        from rlpost.llm.model import tiny

        model = str(tiny.build_base(progress=progress))
    if not (Path(model) / "config.json").is_file():
        raise ConfigError(f"reward-model: --model {model!r} is not a model folder")
    m, tok = load_model(model)
    losses = train_variance_rm(m, tok, rows, steps=steps, lr=lr, seed=seed, progress=progress)
    report = {"data": data or "embedded judges (tiny model's arithmetic answers)",
              "pairs": len(rows), "held_out": len(held), "steps": steps,
              "loss_first": losses[0], "loss_last": losses[-1], **evaluate_rm(m, tok, held)}  # fmt: skip
    out = Path(out)
    m.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "reward_model.json").write_text(json.dumps(report, indent=1))
    return report


class VarianceReward:
    """A saved reward model as a reward function ``fn(completion, example) -> mu - kappa
    sigma`` (run it in process: ``reward.workers=0``), and best-of-N by the same."""

    def __init__(self, path: str | Path, kappa: float = 0.0):
        self.model, self.tok = load_model(path)
        self.model.eval()
        self.kappa = float(kappa)
        self.__name__ = f"variance_rm({Path(path).name}, kappa={kappa:g})"

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        mu, lv = heads(self.model, self.tok, prompts, completions)
        return risk_adjusted(mu, lv.exp(), self.kappa)

    def __call__(self, completion: str, example: Any) -> float:
        return float(self.score([example.prompt], [completion])[0])

    @torch.no_grad()
    def best_of_n(self, prompt: str, candidates: list[str]) -> int:
        mu, lv = heads(self.model, self.tok, [prompt] * len(candidates), candidates)
        return int(best_of_n(mu[None], lv.exp()[None], self.kappa)[0])
