"""MIPU (004-26): the inference-side gap on hand-worked values, and a rejected candidate
leaves the weights, the optimiser and the schedule exactly as they were."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlpost.core.mipu import inference_gap
from rlpost.llm.config import load_config
from rlpost.llm.trainer import Trainer


def test_the_gap_on_hand_worked_values():
    sampler = torch.tensor([[-1.0, -2.0, -3.0]])
    cand = sampler + torch.tensor([[math.log(2.0), 0.0, 5.0]])  # the last token is masked
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    g = inference_gap(cand, sampler, torch.tensor([[1.0, 1.0, 1.0]]), mask)
    assert g.gain == pytest.approx((2 - 1 + 0) / 2)
    assert g.kl == pytest.approx((0.5 - 1 + math.log(2.0)) / 2)
    seq = inference_gap(cand, sampler, torch.tensor([-1.0]), mask)  # a sequence advantage
    assert seq.gain == pytest.approx(-0.5) and not seq.accepts()
    same = inference_gap(sampler, sampler, torch.randn(1, 3), mask)
    assert same.gain == 0.0 and same.kl == 0.0 and same.accepts()
    assert g.accepts(penalty=1.0) and not g.accepts(penalty=1.0, min_gain=0.45)
    nan = inference_gap(cand * float("nan"), sampler, torch.ones(1, 3), mask)
    assert not nan.accepts(min_gain=-1e9)


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def _rows(cfg):
    text = (Path(cfg.run.dir) / "metrics.jsonl").read_text()
    return [r for r in map(json.loads, text.splitlines()) if "accuracy" in r]


def test_rejected_candidates_leave_everything_unchanged(fast_cfg):
    cfg = fast_cfg("train.mipu={min_gain: 1.0e9}", "train.steps=3", "optim.lr=1e-2")
    tr = Trainer(cfg, reward_fn=parity)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    after = tr.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert tr.optimizer.state_dict()["state"] == {}  # no Adam moments kept either
    assert tr.scheduler.last_epoch == 0 and tr.version == 0
    rows = _rows(cfg)
    assert [r["mipu/accepted"] for r in rows] == [0.0, 0.0, 0.0]
    assert rows[-1]["mipu/rejected"] == 3.0
    assert all(math.isfinite(r["mipu/gain"]) and r["mipu/kl"] >= 0 for r in rows)


def test_the_rejection_count_survives_a_resume(fast_cfg):
    cfg = fast_cfg("train.mipu={min_gain: 1.0e9}", "train.steps=3", "run.save_every=2")
    first = Trainer(cfg, reward_fn=parity)
    first.train(until=2)  # two rejections, then the step-2 checkpoint
    first.close()
    resumed = Trainer(cfg, reward_fn=parity, resume=True)
    assert resumed.step == 2 and resumed.components.get("mipu").rejected == 2
    resumed.train()
    assert _rows(cfg)[-1]["mipu/rejected"] == 3.0


def test_accepted_candidates_are_the_sampler_referenced_update(tmp_path, fast_overrides):
    """Always accepting gives the plain update: on CPU the sampler's log-probs equal the
    trainer's to float error, so the sampler-referenced ratio is the on-policy one."""
    common = [*fast_overrides, "train.steps=2", "optim.lr=1e-3"]
    a = Trainer(load_config(None, [*common, f"run.dir={tmp_path / 'a'}"]), reward_fn=parity)
    init = {k: v.clone() for k, v in a.model.state_dict().items()}
    a.train()
    cfg_b = load_config(
        None, [*common, "train.mipu={min_gain: -1.0e9}", f"run.dir={tmp_path / 'b'}"]
    )
    b = Trainer(cfg_b, reward_fn=parity)
    b.train()
    assert b.version == 2 and [r["mipu/accepted"] for r in _rows(cfg_b)] == [1.0, 1.0]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-5, rtol=1e-4)
    assert any(not torch.equal(sa[k], init[k]) for k in sa)  # (training moved them)


@pytest.mark.parametrize(
    "overrides",
    [["train.pipeline=one_step_off"], ["rollout.workers=2"], ["rollout.engine=vllm"]],
)
def test_mipu_refuses_engines_it_cannot_score_on(overrides):
    with pytest.raises(ValueError, match=r"train\.mipu"):
        load_config(None, ["train.mipu={}", *overrides])
