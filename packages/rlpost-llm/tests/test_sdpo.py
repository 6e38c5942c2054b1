"""SDPO (catalog 004-20) as continual post-training: its recipe trains a sequence of
tasks, and at every stage the self-teacher reads the feedback of that stage's own
verifier on the student's answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlpost.llm.config import load_config
from rlpost.llm.recipes import recipe_path


def test_the_recipe_distils_each_stage_from_its_own_tasks_feedback(
    fast_overrides, tmp_path, monkeypatch
):
    from rlpost.llm.methods.distill import Teachers
    from rlpost.llm.trainer import Trainer

    seen: list[dict] = []
    score = Teachers.score

    def spy(self, batch, examples, *a, **k):
        seen.extend(e.meta for e in examples)
        return score(self, batch, examples, *a, **k)

    monkeypatch.setattr(Teachers, "score", spy)
    cfg = load_config(
        recipe_path("sdpo_continual"),
        [
            *fast_overrides, f"run.dir={tmp_path / 'run'}", "run.eval_every=1",
            "data.curriculum=[{task: arithmetic, task_params: {digits: 2}, steps: 1}, "
            "{task: countdown, steps: 1}]",
        ],
    )  # fmt: skip
    assert cfg.preset().name == "sdpo" and cfg.distill.memory is not None
    Trainer(cfg).train()
    by_stage = {s: [m["reflection"] for m in seen if m["stage"] == s] for s in (0, 1)}
    arithmetic, countdown = re.compile(r"\d+[+-]\d+"), re.compile(r"\(\)|-?\d+=\d+[+-]")
    assert by_stage[0] and by_stage[1]
    assert any(by_stage[0]) and any(by_stage[1])  # (the untrained policy fails somewhere)
    assert all(arithmetic.fullmatch(r) for r in by_stage[0] if r)
    assert all(countdown.fullmatch(r) for r in by_stage[1] if r)
    rows = [
        json.loads(x) for x in (Path(tmp_path / "run") / "metrics.jsonl").read_text().splitlines()
    ]
    evals = {k for r in rows for k in r if k.startswith("eval/")}
    assert {"eval/0-arithmetic/accuracy", "eval/1-countdown/accuracy"} <= evals
