"""Checkpoints and exact resume of ``rlpost-robot train`` (every learner's state export).

A resumed run must end where the uninterrupted one does, bitwise: the final policy, every
tensor of the final checkpoint (critics, targets, teacher, optimisers, replay buffer,
generators) and the ``metrics.jsonl`` rows, but for the wall-clock ``seconds``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpost.apps.robot.cli import main
from rlpost.core.testing import kill_at_first_checkpoint
from rlpost.robot.algos import ALGORITHMS, common
from rlpost.robot.config import load_config, recipe_path, recipes_dir
from rlpost.robot.train import train_from_config

CLI = [sys.executable, "-m", "rlpost.apps.robot.cli", "train"]
ALGORITHM_NAMES = ALGORITHMS.names()


def recipe_names() -> list[str]:
    return [p.stem for p in recipes_dir().glob("*.yaml")]


COMMON = [
    "demos.n_good=2",
    "demos.n_poor=2",
    "run.eval_episodes=2",
    "run.eval_steps=[1]",
    "run.progress=false",
    "run.threads=1",
]
OTQL = [
    "--config",
    "otql_reacher",
    "algo.params.envs=2",
    "algo.params.updates_per_round=3",
    "algo.params.critic_pretrain_steps=5",
    "algo.params.batch_size=32",
    "policy.bc_steps=20",
    "policy.hidden=32",
    *COMMON,
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "seconds"}


def _rows(run: Path) -> list[dict]:
    return [_without_time(json.loads(r)) for r in (run / "metrics.jsonl").read_text().splitlines()]


def _final_checkpoint(run: Path) -> Path:
    return run / "checkpoints" / json.loads((run / "checkpoints/latest.json").read_text())["dir"]


def assert_same_run(ref: Path, other: Path) -> None:
    """The same final policy, final checkpoint (every tensor, and its JSON state but for the
    wall-clock) and metrics rows, bitwise."""
    a, b = (
        load_file(ref / "policy/model.safetensors"),
        load_file(other / "policy/model.safetensors"),
    )
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"policy {k}"
    ca, cb = _final_checkpoint(ref), _final_checkpoint(other)
    assert ca.name == cb.name
    files = sorted(f.name for f in ca.glob("*.safetensors"))
    assert files == sorted(f.name for f in cb.glob("*.safetensors"))
    assert "tensors.safetensors" in files or "teacher.safetensors" in files
    for name in files:
        ta, tb = load_file(ca / name), load_file(cb / name)
        assert ta.keys() == tb.keys(), name
        for k in ta:
            assert torch.equal(ta[k], tb[k]), f"{name}: {k}"
    sa, sb = (json.loads((c / "state.json").read_text()) for c in (ca, cb))
    for s in (sa, sb):
        s["loop"]["history"] = [_without_time(r) for r in s["loop"]["history"]]
    assert sa == sb
    assert _rows(ref) == _rows(other)
    da, db = (json.loads((r / "demo.json").read_text()) for r in (ref, other))
    for k in ("before_metrics", "after_metrics"):
        assert da[k] == db[k], k
    assert (da["experience"] or {}).get("episodes") == (db["experience"] or {}).get("episodes")
    assert _experience(ref) == _experience(other)


def _experience(run: Path) -> list[tuple]:
    """The recorded online episodes (``run.dir/experience``) as comparable tuples: the
    episodes after a checkpoint are recorded once, as in the uninterrupted run."""
    from rlpost.robot.fleet.store import ExperienceStore

    if not (run / "experience" / "store.json").is_file():
        return []
    eps = ExperienceStore.open_read(run / "experience").read()
    return [
        (e.obs.tobytes(), e.actions.tobytes(), e.rewards.tobytes(), e.policy_version,
         e.robot, e.episode_id)
        for e in eps
    ]  # fmt: skip


def test_otql_sigkill_then_resume_equals_the_uninterrupted_run(tmp_path, cache):
    episodes = 6  # 3 rounds of 2 episodes, a checkpoint after each (killed after the 1st)
    args = [*OTQL, f"algo.params.episodes={episodes}"]
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    # the reference runs in this process: same code, seeds and thread count (and it fills
    # the cache of demonstrations and BC policy the subprocesses load)
    train_from_config(load_config(recipe_path("otql_reacher"), [*args[2:], f"run.dir={ref}"]))
    killed_at = kill_at_first_checkpoint([*CLI, *args, f"run.dir={killed}"], killed, env)
    assert killed_at < episodes, "the run must be killed mid-training"
    assert not (killed / "policy").exists()
    done = subprocess.run(
        [*CLI, *args, f"run.dir={killed}", "--resume"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after OTQL" in done.stdout
    assert_same_run(ref, killed)


def _crash_at(monkeypatch, crash_round: int) -> type[Exception]:
    """Make the online loop die after logging round ``crash_round``, before its
    checkpoint (so the resume must also drop that round's metrics row)."""

    class Crash(Exception):
        pass

    save = common._save_round

    def save_or_crash(learner, ck, rounds, used, history):
        if rounds == crash_round:
            raise Crash(f"killed after round {rounds}")
        save(learner, ck, rounds, used, history)

    monkeypatch.setattr(common, "_save_round", save_or_crash)
    return Crash


def _recipe_of(algo: str) -> str:
    """The first shipped recipe that trains ``algo`` (every registered algorithm ships one)."""
    for name in sorted(recipe_names()):
        if load_config(recipe_path(name)).algo.name == algo:
            return name
    raise AssertionError(f"algorithm {algo!r} has no recipe")


SMALL_ALGO = {"envs": 2, "updates_per_round": 2, "critic_pretrain_steps": 2, "batch_size": 32,
              "value_steps": 5, "offline_steps": 5}  # fmt: skip
SMALL_POLICY = {"bc_steps": 10, "hidden": 32, "dim_model": 16}


def _small(algo: str, episodes: int) -> list[str]:
    """Overrides that make any algorithm's recipe quick: its own knobs of SMALL_ALGO, its
    policy kind's settings of SMALL_POLICY."""
    import dataclasses

    from rlpost.robot.policies.kinds import POLICY_KINDS

    a = ALGORITHMS.get(algo)
    fields = {f.name for f in dataclasses.fields(a.config)}
    settings = POLICY_KINDS[a.policy_kind].config.model_fields
    return [
        *(f"algo.params.{k}={v}" for k, v in SMALL_ALGO.items() if k in fields),
        *(f"policy.params.{k}={v}" for k, v in SMALL_POLICY.items() if k in settings),
        f"algo.params.episodes={episodes}",
        *COMMON,
    ]


@pytest.mark.parametrize("algo", ALGORITHM_NAMES)
def test_resume_after_a_crash_equals_the_uninterrupted_run(algo, tmp_path, cache, monkeypatch):
    """Every registered algorithm (its learner's whole state: actors, critics, targets,
    teachers, value baselines, buffers, counters, generators) resumes in-process to the
    uninterrupted run."""
    recipe, args = _recipe_of(algo), _small(algo, episodes=8)  # 4 rounds
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    want = train_from_config(load_config(recipe_path(recipe), [*args, f"run.dir={ref}"]))
    cfg = load_config(recipe_path(recipe), [*args, f"run.dir={crashed}"])
    with monkeypatch.context() as m:
        crash = _crash_at(m, crash_round=3)
        with pytest.raises(crash):
            train_from_config(cfg)
    assert len(_rows(crashed)) == 3  # round 3 was logged; its checkpoint was not written
    assert json.loads((crashed / "checkpoints/latest.json").read_text())["step"] == 4
    got = train_from_config(cfg, resume=True)
    assert [_without_time(r) for r in got["history"]] == [_without_time(r) for r in want["history"]]
    assert_same_run(ref, crashed)


@pytest.mark.parametrize(  # every registered algorithm; OTQL's (above) in the default tier
    "algo", [pytest.param(a, marks=pytest.mark.slow) for a in ALGORITHM_NAMES if a != "otql"]
)
def test_every_algorithm_resumes_after_sigkill(algo, tmp_path, cache):
    recipe, args = _recipe_of(algo), _small(algo, episodes=6)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    train_from_config(load_config(recipe_path(recipe), [*args, f"run.dir={ref}"]))
    cli = [*CLI, "--config", recipe, *args, f"run.dir={killed}"]
    assert kill_at_first_checkpoint(cli, killed, env) < 6, "killed mid-training"
    done = subprocess.run([*cli, "--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(ref, killed)


SUMMARY_KEYS = ("domain", "run_dir", "steps", "seconds", "first", "last", "before", "after")


def test_a_used_run_dir_needs_resume_or_overwrite(tmp_path, cache, capsys):
    run = tmp_path / "run"
    args = ["train", *OTQL, "algo.params.episodes=6", "run.save_every=2", f"run.dir={run}"]
    assert main(args) == 0
    # every 2 rounds and after the last (round 3), the newest 2 kept
    steps = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert steps == ["step-000004", "step-000006"]
    assert len(_rows(run)) == 3
    summary = json.loads((run / "summary.json").read_text())  # the shape every domain writes
    assert set(SUMMARY_KEYS) <= set(summary) and summary["domain"] == "robot"
    assert summary["steps"] == 6 and "success" in summary["after"]["1"]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err
    with pytest.raises(SystemExit):  # they exclude each other
        main([*args, "--resume", "--overwrite"])
    capsys.readouterr()
    # resuming the finished run restores its last checkpoint and reports the same table
    before = _rows(run)
    assert main([*args, "--resume"]) == 0
    assert "after OTQL" in capsys.readouterr().out and _rows(run) == before
    # --overwrite replaces it: old checkpoints gone, none written with save_every=0
    assert main([*args, "run.save_every=0", "--overwrite"]) == 0
    assert not (run / "checkpoints").exists() and len(_rows(run)) == 3


def test_a_learning_rate_of_1e30_stops_in_one_line_with_exit_3(tmp_path, cache, capsys):
    """Before: a traceback from the sampler (NaN probabilities) mid-update."""
    run = tmp_path / "run"
    args = ["train", *OTQL, "algo.params.episodes=4", "algo.params.policy_lr=1e30",
            "run.save_every=1", f"run.dir={run}"]  # fmt: skip
    assert main(args) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert "round 1 (2 episodes): the update left the parameters of policy" in err[-1]
    assert "lower the learning rates, then --resume" in err[-1]
    assert not list((run / "checkpoints").glob("step-*"))  # nothing diverged was kept


@pytest.mark.parametrize("content", [None, "{not json"])
def test_a_bad_data_set_is_named_in_one_line_before_the_run_directory(tmp_path, capsys, content):
    """Before: the one-line error came after ``config.yaml`` and the lock were written."""
    data, run = tmp_path / "data", tmp_path / "run"
    if content is not None:
        (data / "meta").mkdir(parents=True)
        (data / "meta" / "info.json").write_text(content)
    assert main(["train", *OTQL, f"data.path={data}", f"run.dir={run}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(data) in err
    assert not run.exists()


def test_an_error_from_a_bug_mid_update_keeps_its_traceback():
    class Buggy:
        policy = torch.nn.Linear(2, 2)

        def collect(self, n, seed):
            return n

        def update(self, n):
            raise ValueError("a bug, not a divergence")

        def export_state(self):
            return common.LearnerState(self.policy, None)

    with pytest.raises(ValueError, match="a bug, not a divergence"):
        common.online_loop(Buggy(), episodes=2, envs=2, seed=0, progress=False)


def test_residual_job_refuses_a_used_run_dir_unless_overwrite(tmp_path, capsys):
    run = tmp_path / "residual"
    small = ["data.train=4", "data.test=2", "data.steps=40", "agent.steps=20", "agent.hidden=16"]
    args = ["residual", "--config", "decoding", *small, "run.progress=false", f"run.dir={run}"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert (run / "residual.json").is_file()


def test_an_update_that_makes_parameters_non_finite_stops_the_loop(tmp_path):

    from rlpost.core.guard import RunStopped
    from rlpost.robot.algos.common import Checkpoints, LearnerState, online_loop

    class Diverging:
        def __init__(self):
            self.policy = torch.nn.Linear(2, 2)
            self.critic = torch.nn.Linear(2, 1)
            self.opt = torch.optim.SGD(self.policy.parameters(), lr=0.1)
            self.rounds = 0

        def collect(self, n, seed):
            return n

        def update(self, n):
            self.rounds += 1
            if self.rounds == 2:  # the second round's update diverges
                with torch.no_grad():
                    self.critic.weight.fill_(float("nan"))
            return {"online_success": 0.0}

        def export_state(self):
            return LearnerState(self.policy, self.opt, extras={"critic": (self.critic, None)})

        def import_state(self, state, tensors):
            pass

    rows = []
    root = tmp_path / "checkpoints"
    with pytest.raises(RunStopped, match=r"round 2 \(4 episodes\).*of critic non-finite"):
        online_loop(
            Diverging(), episodes=8, envs=2, seed=0, log=rows.append, progress=False,
            checkpoints=Checkpoints(root),
        )  # fmt: skip
    assert [r["episodes"] for r in rows] == [2, 4]  # the round is logged, then it stops
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002"]  # never saved
