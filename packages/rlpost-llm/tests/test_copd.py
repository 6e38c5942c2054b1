"""CoPD (catalog 001-26): experts as Ray actors, bidirectional OPD between them, a killed
expert restarted from its checkpoint without losing the run, consolidation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.llm.config import ConfigError
from rlpost.llm.runtimes.copd import expert_config, run_copd

MIX = "data.mixture=[{task: arithmetic}, {task: countdown}]"


def test_an_expert_is_rewarded_on_its_domain_and_taught_on_the_others(fast_cfg):
    cfg = fast_cfg("algo.preset=copd", MIX, "copd.rounds=2")
    c = expert_config(cfg, "arithmetic", ["arithmetic", "countdown"], 1)
    assert [(d.task, d.reward) for d in c.data.mixture] == [
        ("arithmetic", True),
        ("countdown", False),
    ]
    assert [(t.path, t.domains) for t in c.distill.teachers] == [(cfg.model.path, ["countdown"])]
    assert c.run.dir.endswith("experts/arithmetic") and c.run.save_every == 1 and c.copd is None


def test_copd_config_errors_name_the_problem(fast_cfg):
    with pytest.raises(ConfigError, match="two or more domains"):
        fast_cfg("algo.preset=copd", "copd.rounds=2")
    with pytest.raises(ConfigError, match=r"multiple of copd\.rounds"):
        fast_cfg("algo.preset=copd", MIX, "copd.rounds=3")


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_a_killed_expert_restarts_from_its_checkpoint_and_the_run_completes(fast_cfg, tmp_path):
    """Two experts, two rounds of one step; the arithmetic expert's actor is killed after
    round 1. Ray restarts it, it resumes from its round-1 checkpoint, gets its peer's
    weights again, and the run finishes both rounds and the MOPD consolidation."""
    import ray

    cfg = fast_cfg(
        "algo.preset=copd", MIX, "copd.rounds=2", "copd.consolidate_steps=1",
        f"run.dir={tmp_path / 'copd'}", "run.eval_every=2",
    )  # fmt: skip
    killed = []

    def kill(r, actors):
        if r == 0:
            ray.kill(actors["arithmetic"], no_restart=False)
            killed.append(r)

    summary = run_copd(cfg, kill=kill, progress=False)
    assert killed == [0]
    assert summary["restarts"] == {"arithmetic": 1, "countdown": 0}
    ar, cd = summary["experts"]["arithmetic"], summary["experts"]["countdown"]
    assert ar["step"] == cd["step"] == 2
    assert ar["resumed_at"] == 1 and cd["resumed_at"] is None  # from the checkpoint, not 0
    steps = [
        json.loads(x)["step"]
        for x in (Path(cfg.run.dir) / "experts" / "arithmetic" / "metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    assert steps == [0, 1, 2]  # nothing lost, nothing repeated
    st = summary["student"]
    assert st["how"] == "mopd" and st["steps"] == 1
    assert {"eval/arithmetic/accuracy", "eval/countdown/accuracy"} <= set(st)
    assert (Path(cfg.run.dir) / "copd.json").is_file()
    with pytest.raises(ValueError, match="holds a CoPD run: --resume"):
        run_copd(cfg, progress=False)  # one run per run directory
