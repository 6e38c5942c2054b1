"""Value retention (001-25's study as a tool): every probe at every checkpoint of every run,
each verified by its own task; the checkpoint's weights are what is probed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlpost.llm.data.tasks import make_task
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.tools import retention as ret
from rlpost.llm.trainer import Trainer


def test_a_probe_spec_names_a_task_and_its_parameters():
    assert ret.parse_probe("arithmetic") == ("arithmetic", {})
    assert ret.parse_probe("arithmetic:{digits: 1}") == ("arithmetic", {"digits": 1})
    with pytest.raises(ValueError, match="digitz"):
        ret.parse_probe("arithmetic:{digitz: 1}")


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


def test_every_checkpoint_is_probed_and_scored_by_the_probes_own_task(
    fast_cfg, tmp_path, monkeypatch
):
    cfg = fast_cfg("train.steps=2", "run.save_every=1", "run.keep_checkpoints=5", "optim.lr=1e-2")
    Trainer(cfg, reward_fn=_odd_length).train()  # (a reward that varies: the weights move)
    seen = []

    def engine(_name, model, tok):  # answers right when the first operand is even
        name = "model.layers.0.self_attn.q_proj.weight"
        seen.append((name, float(dict(model.named_parameters())[name].detach().sum())))

        def script(p, n):
            a, b = tok.decode(p).rstrip("=").split("+")
            ans = str(int(a) + int(b)) if int(a) % 2 == 0 else "0"
            ids = tok(ans, add_special_tokens=False).input_ids
            return [([*ids, tok.eos_token_id], [-1.0] * (len(ids) + 1), "stop")] * n

        return FakeEngine(script)

    monkeypatch.setattr("rlpost.llm.rollout.engines.make_local_engine", engine)
    table = ret.retention([cfg.run.dir], ["arithmetic:{digits: 1}"], tmp_path / "r", size=16)
    rows = table["runs"][str(cfg.run.dir)]
    assert [r["step"] for r in rows] == [0, 1, 2]
    task = make_task("arithmetic", digits=1)
    held = task.sample(16, random.Random(50_000))
    want = sum(e.meta["a"] % 2 == 0 for e in held) / 16  # the even first operands
    assert all(r["arithmetic:{digits: 1}"] == pytest.approx(want) for r in rows)
    run = Path(cfg.run.dir)
    ck = [
        load_file(str(run / "checkpoints" / f"step-00000{s}" / "model.safetensors")) for s in (1, 2)
    ]
    name = seen[0][0]  # the probed weights are each checkpoint's
    assert seen[1][1] == pytest.approx(float(ck[0][name].sum())) and seen[1] != seen[2]
    assert seen[2][1] == pytest.approx(float(ck[1][name].sum()))
    assert json.loads((tmp_path / "r" / "retention.json").read_text())["probes"] == [
        "arithmetic:{digits: 1}"
    ]
    assert (tmp_path / "r" / "retention.png").is_file()


def test_parameter_drift_is_the_relative_norm_over_float_tensors():
    import torch

    base = {"w": torch.tensor([3.0, 4.0]), "step": torch.tensor([7])}
    moved = {"w": torch.tensor([3.0, 9.0]), "step": torch.tensor([100])}
    assert ret.param_drift(moved, base) == pytest.approx(1.0)  # ||(0, 5)|| / ||(3, 4)||
    assert ret.param_drift(base, base) == 0.0


def test_response_kl_equals_the_kl_of_each_prefix_scored_alone():
    """The batched, padded KL against an independent one: every answer token's
    distributions from its own unpadded prefix, KL by torch.distributions."""
    import torch
    from torch.distributions import Categorical, kl_divergence
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.data.tasks import Example
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    a = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    b = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    texts = ("12+3=", "7+45=", "1+1=")
    prompts = [tok(p, add_special_tokens=False).input_ids for p in texts]
    batch = ret.greedy_answers(a, tok, [Example(p, "", {}) for p in texts], 5)
    want, n = 0.0, 0
    for p, c, m in zip(batch.prompt_ids, batch.completion_ids, batch.mask, strict=True):
        answer = c[: int(m.sum())].tolist()
        for j in range(len(answer)):
            ids = torch.tensor([[*p, *answer[:j]]])
            with torch.no_grad():
                pa, pb = a(input_ids=ids).logits[0, -1], b(input_ids=ids).logits[0, -1]
            want += float(kl_divergence(Categorical(logits=pa), Categorical(logits=pb)))
            n += 1
    assert len({len(p) for p in prompts}) > 1 and n > 3  # (ragged: padding is exercised)
    assert ret.response_kl(a, b, batch) == pytest.approx(want / n, rel=1e-4)
    assert ret.response_kl(a, a, batch) == pytest.approx(0.0, abs=1e-12)


def test_the_cli_prints_each_checkpoints_drift_beside_its_accuracy(fast_cfg, tmp_path, capsys):
    from rlpost.apps.llm.cli import main

    cfg = fast_cfg("train.steps=2", "run.save_every=1", "run.keep_checkpoints=5", "optim.lr=1e-2")
    Trainer(cfg, reward_fn=_odd_length).train()
    probe = "arithmetic:{digits: 1}"
    out = tmp_path / "r"
    assert (
        main(["retention", str(cfg.run.dir), "--probe", probe, "--size", "8", "--out", str(out)])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert "drift" in lines[1] and f"KL {probe}"[:22] in lines[1]
    rows = json.loads((out / "retention.json").read_text())["runs"][str(cfg.run.dir)]
    assert rows[0]["param_drift"] == 0.0 and rows[0][f"{probe} kl"] == pytest.approx(0.0, abs=1e-9)
    assert rows[2]["param_drift"] > 0
    assert lines[2].split()[:2] == ["0", "0.000"]
