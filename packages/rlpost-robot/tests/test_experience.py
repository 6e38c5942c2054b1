"""A train run's online episodes as a LeRobotDataset (``run.dir/experience``) with reward,
done, success and intervention columns, and that data set read back into a replay."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot")

from rlpost.core.io.rundir import locked_here
from rlpost.robot.algos.common import chunk_transitions
from rlpost.robot.config import load_config, recipe_path
from rlpost.robot.demos import collect_demos
from rlpost.robot.experience import ExperienceRecorder
from rlpost.robot.fleet.store import ExperienceStore
from rlpost.robot.lerobot_data import load_lerobot_dataset, open_lerobot_dataset
from rlpost.robot.train import demo_episodes, train_from_config

SMALL = [
    "algo.params.episodes=4", "algo.params.envs=2", "algo.params.updates_per_round=2",
    "algo.params.critic_pretrain_steps=5", "policy.bc_steps=20", "policy.hidden=32",
    "demos.n_good=2", "demos.n_poor=2", "run.eval_episodes=2", "run.eval_steps=[1]",
    "run.progress=false",
]  # fmt: skip


def test_a_train_runs_online_episodes_are_its_lerobot_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    cfg = load_config(recipe_path("otql_reacher"), [*SMALL, f"run.dir={run}"])
    result = train_from_config(cfg)
    assert not locked_here(run)  # the run has ended: its directory is released
    assert result["experience"] == {"episodes": 4, "path": str(run / "experience" / "current")}
    ds = open_lerobot_dataset(run / "experience")
    assert ds.meta.total_episodes == 4
    for column in ("next.reward", "next.done", "next.success", "intervention", "policy_version"):
        assert column in ds.meta.features, column
    eps = load_lerobot_dataset(run / "experience", "reacher")
    assert [e.policy_version for e in eps] == [0, 0, 1, 1]  # round 2's policy had 1 update
    assert [e.episode_id for e in eps] == [0, 1, 2, 3] and [e.robot for e in eps] == [0, 1, 0, 1]
    assert all(not e.intervention.any() for e in eps)  # no human drives a train run
    # the episodes the loop trained on: each round's logged success is theirs
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    for r, row in enumerate(rows):
        mine = [e.success for e in eps[2 * r : 2 * r + 2]]
        assert row["online_success"] == pytest.approx(np.mean(mine))
    spool = ExperienceStore.open_read(run / "experience").read()
    for a, b in zip(eps, spool, strict=True):  # exact through lerobot's parquet files
        for k in ("obs", "actions", "rewards", "intervention"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k


def test_intervention_reward_and_done_columns_round_trip_into_the_replay(tmp_path):
    """Episodes with human steps, recorded, written as a LeRobotDataset and read back,
    give the replay the same transitions, and the same intervention steps."""
    eps = collect_demos("reacher", 2, 1, seed=3)
    rng = np.random.default_rng(0)
    for e in eps:
        e.intervention = rng.random(len(e)) < 0.3
    rec = ExperienceRecorder(tmp_path / "experience", "reacher")
    rec(eps[:2], 0, 0)
    rec(eps[2:], 1, 2)
    assert rec.finish()["episodes"] == 3
    back = load_lerobot_dataset(tmp_path / "experience", "reacher")
    for a, b in zip(eps, back, strict=True):
        assert np.array_equal(a.intervention, b.intervention)
        assert np.array_equal(a.rewards, b.rewards) and a.terminated == b.terminated
        assert a.success == b.success
    want, got = (chunk_transitions(x, horizon=4, execute=4, gamma=0.99) for x in (eps, back))
    for k in want.__dict__:
        assert torch.equal(getattr(want, k), getattr(got, k)), k
    ds = open_lerobot_dataset(tmp_path / "experience")
    done = np.asarray(ds.hf_dataset.with_format("numpy")["next.done"]).reshape(-1)
    assert done.sum() == 3  # one last frame per episode


def test_data_path_trains_on_a_runs_experience(tmp_path, monkeypatch):
    """``data.path=<run>/experience``: the recorded episodes are the next run's data."""
    eps = collect_demos("reacher", 2, 2, seed=5)
    rec = ExperienceRecorder(tmp_path / "exp", "reacher")
    rec(eps, 0, 0)
    rec.finish()
    cfg = load_config(recipe_path("otql_reacher"), [*SMALL, f"data.path={tmp_path / 'exp'}"])
    demos = demo_episodes(cfg)
    assert [e.rewards.tobytes() for e in demos] == [e.rewards.tobytes() for e in eps]


def test_a_resumed_recorder_forgets_the_episodes_past_its_checkpoint(tmp_path):
    eps = collect_demos("reacher", 3, 0, seed=1)
    rec = ExperienceRecorder(tmp_path / "exp", "reacher")
    rec(eps, 0, 0)
    assert rec.finish()["episodes"] == 3
    again = ExperienceRecorder(tmp_path / "exp", "reacher", keep=1)  # checkpoint after 1
    assert len(again.store) == 1
    again(eps[1:], 1, 1)
    assert again.finish()["episodes"] == 3
    back = load_lerobot_dataset(tmp_path / "exp", "reacher")
    assert [e.policy_version for e in back] == [0, 1, 1]
    assert [e.actions.tobytes() for e in back] == [e.actions.tobytes() for e in eps]
