"""The value-gradient tool (000-11's study): on a run's initial weights and two kept
checkpoints, its headroom is what the scripted samples give, and its signals are the
unbiased pair sums of per-sample gradients computed here independently (one backward
pass per sample, loops over pairs)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_model

from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import make_task
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.tools import value_gradient as vg
from rlpost.llm.tools.weights import checkpoint_steps, run_base
from rlpost.llm.trainer import Trainer

K = 4


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


def _script(tok):
    """Even first operand: sample 0 right, the rest wrong; odd: every sample wrong."""

    def script(p, n):
        a, b = tok.decode(p).rstrip("=").split("+")
        rows = []
        for i in range(n):
            ans = str(int(a) + int(b) + (0 if i == 0 and int(a) % 2 == 0 else 1 + i))
            ids = tok(ans, add_special_tokens=False).input_ids
            rows.append(([*ids, tok.eos_token_id], [-1.0] * (len(ids) + 1), "stop"))
        return rows

    return script


def _signals(model, tok, examples) -> tuple[float, float]:
    """``(mean_p ||grad J(x_p)||^2, ||E_p g_p||^2)``, written out: every sample's
    ``grad log pi`` by its own ``.backward()``, the pair sums as loops."""
    script, task, own, per_prompt = _script(tok), make_task("arithmetic"), [], []
    for e in examples:
        p = encode_prompt(tok, e.prompt)
        rows = script(p, K)
        r = [task.score(tok.decode(ids[:-1]), e) for ids, _, _ in rows]
        s = []
        for ids, _, _ in rows:
            model.zero_grad(set_to_none=False)
            one = make_seq_batch([p], torch.tensor([ids]), torch.ones(1, len(ids)), 0)
            completion_logprobs(model, one, 1.0)[0].sum().backward()
            s.append(torch.cat([q.grad.flatten().double() for q in model.parameters()]))
        pairs = 0.0
        for i in range(K):
            for j in range(K):
                if i != j:
                    c = (sum(r) - r[i] - r[j]) / (K - 2)
                    pairs += (r[i] - c) * (r[j] - c) * float(s[i] @ s[j])
        own.append(pairs / (K * (K - 1)))
        per_prompt.append(sum((r[i] - (sum(r) - r[i]) / (K - 1)) / K * s[i] for i in range(K)))
    P = len(per_prompt)
    batch = sum(float(per_prompt[i] @ per_prompt[j]) for i in range(P) for j in range(P) if i != j)
    return sum(own) / P, batch / (P * (P - 1))


def test_signal_and_headroom_on_a_runs_checkpoints_match_a_hand_computation(
    fast_cfg, tmp_path, monkeypatch
):
    cfg = fast_cfg("train.steps=2", "run.save_every=1", "run.keep_checkpoints=5", "optim.lr=1e-2")
    Trainer(cfg, reward_fn=_odd_length).train()
    monkeypatch.setattr(
        "rlpost.llm.rollout.engines.make_local_engine", lambda _n, m, tok: FakeEngine(_script(tok))
    )
    rows = vg.value_gradient([cfg.run.dir], cfg, tmp_path / "vg", prompts=6, samples=K)
    assert [r["model"] for r in rows] == ["run@0", "run@1", "run@2"]
    examples = make_task("arithmetic").sample(6, random.Random(60_000))
    even = sum(e.meta["a"] % 2 == 0 for e in examples) / 6
    assert 0 < even < 1
    _, model, tok = run_base(cfg.run.dir, "test")
    signals = []
    for row, load in zip(rows, [None, *checkpoint_steps(cfg.run.dir)], strict=True):
        assert row["mean_reward"] == pytest.approx(even / K)
        assert row["reachable_reward"] == pytest.approx(even)
        assert row["headroom"] == pytest.approx(even * (K - 1) / K)
        if load is not None:
            load_model(model, str(load[1] / "model.safetensors"))
        own, batch = _signals(model, tok, examples)
        assert row["signal_sq"] == pytest.approx(own, rel=1e-4)
        assert row["batch_signal_sq"] == pytest.approx(batch, rel=1e-4, abs=1e-12)
        assert row["criterion"] == pytest.approx(max(own, 0) ** 0.5 * row["headroom"], rel=1e-4)
        signals.append(row["signal_sq"])
    assert signals[0] != signals[2]  # (each checkpoint's own weights are measured)
    saved = json.loads((tmp_path / "vg" / "value_gradient.json").read_text())
    assert [r["model"] for r in saved] == ["run@0", "run@1", "run@2"]
    assert (tmp_path / "vg" / "value_gradient.png").is_file()


def test_a_path_that_is_neither_a_run_nor_a_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="neither a run directory nor a model folder"):
        vg.sources([tmp_path])
