"""Rollout traces (run.traces): every trained row in one indexed JSONL stream, consistent
with the step's metrics, cut back exactly on resume, shown by ``rlpost-llm traces``."""

import json
import shutil
from pathlib import Path

import pytest

from rlpost.llm.tools.traces import INDEX, read_step, show_step
from rlpost.llm.trainer import Trainer


def parity(completion, example):
    return float(len(completion) % 2 == 0)


def test_every_trained_row_is_traced_and_agrees_with_the_steps_metrics(fast_cfg, capsys):
    cfg = fast_cfg("run.traces=true", "train.steps=3")
    Trainer(cfg, reward_fn=parity).train()
    run = Path(cfg.run.dir)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    index = [json.loads(x) for x in (run / INDEX).read_text().splitlines()]
    assert [e["step"] for e in index] == [1, 2, 3]
    for row in (r for r in metrics if r["step"] >= 1):
        rows = read_step(run, row["step"])
        assert len(rows) == cfg.rollout.prompts_per_step * cfg.rollout.group_size
        assert sum(r["reward"] for r in rows) / len(rows) == pytest.approx(row["reward/mean"])
        assert all(r["reward"] == parity(r["completion"], None) for r in rows)
        groups = {}
        for r in rows:
            groups.setdefault(r["group"], []).append(r)
        for g in groups.values():  # GRPO: advantages centred within each group
            assert abs(sum(r["advantage"] for r in g)) < 1e-3 * len(g)
            assert len({r["prompt"] for r in g}) == 1
    shown = show_step(run, 2, groups=1)
    assert shown.startswith("step 2:") and "best group" in shown and "worst group" in shown
    from rlpost.apps.llm.cli import main

    assert main(["traces", str(run), "--step", "3"]) == 0
    assert capsys.readouterr().out.startswith("step 3:")
    assert main(["traces", str(run), "--step", "9"]) == 2  # one line naming what exists
    assert "no traces of step 9; traced: 1-3" in capsys.readouterr().err


def test_a_resumed_run_cuts_its_traces_back_to_the_checkpoint(fast_cfg):
    """Steps traced after the checkpoint a run resumes from are dropped, then traced anew:
    each step appears once."""
    cfg = fast_cfg("run.traces=true", "train.steps=4", "run.save_every=2")
    Trainer(cfg, reward_fn=parity).train()
    run = Path(cfg.run.dir)
    shutil.rmtree(run / "checkpoints" / "step-000004")  # as if killed after step 4's traces
    Trainer(cfg, reward_fn=parity, resume=True).train()  # resumes from step 2
    index = [json.loads(x) for x in (run / INDEX).read_text().splitlines()]
    assert [e["step"] for e in index] == [1, 2, 3, 4]
    assert [len(read_step(run, s)) for s in (1, 2, 3, 4)] == [index[0]["rows"]] * 4
    assert (run / "traces.jsonl").stat().st_size == index[-1]["offset"] + index[-1]["bytes"]
