"""The fleet on Ray, faults included: a robot actor killed mid-episode, the learner actor
killed, the whole run killed and resumed; and the ``rlpost-robot fleet`` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from rlpost.robot.config import load_job, recipe_path, recipes_dir
from rlpost.robot.fleet.job import run_fleet
from rlpost.robot.fleet.store import ExperienceStore

ray = pytest.importorskip("ray")

SMALL = [
    "fleet.variants=[{name: nominal}, {name: weak, gain: 0.6}]",
    "fleet.eval_episodes=2",
    "fleet.realtime=1.0",
    "fleet.minutes=5",
    "fleet.view_every=0",
    "learner.params.offline_steps=3",
    "learner.params.batch_size=16",
    "learner.params.hidden=32",
    "learner.params.sample_steps=3",
    "learner.updates_per_version=2",
    "learner.save_every=2",
    "policy.hidden=32",
    "policy.bc_steps=20",
    "demos.n_good=2",
    "demos.n_poor=2",
    "run.progress=false",
    "run.threads=1",
]


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """A local Ray for the module, and one cache of the small BC policy for its runs."""
    cache = str(tmp_path_factory.mktemp("cache"))
    old = os.environ.get("RLPOST_CACHE")
    os.environ["RLPOST_CACHE"] = cache
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield cache
    ray.shutdown()
    if old is None:
        os.environ.pop("RLPOST_CACHE", None)
    else:
        os.environ["RLPOST_CACHE"] = old


def job(run_dir, *more):
    return load_job(
        "fleet", recipe_path("lwd_multimodal_reach", "fleet"), [*SMALL, f"run.dir={run_dir}", *more]
    )


def whole(ep) -> bool:
    """An episode that ended: obs one longer than actions, and it succeeded or timed out."""
    return len(ep.obs) == len(ep.actions) + 1 and (ep.success or len(ep.actions) == 50)


@pytest.fixture(scope="module")
def killed_run(local_ray, tmp_path_factory):
    """One fleet of two robots in which robot 0's actor is killed mid-episode (after it
    recorded one), then the learner's actor; the run goes on until robot 0 has recorded
    two more episodes and the restarted learner has published three more versions."""
    run = tmp_path_factory.mktemp("fleet") / "run"
    seen: dict = {}

    def until(rt):
        slot = rt.slots[0]
        busy = slot.ref is not None and time.monotonic() - slot.since > 0.4
        if "robot" not in seen and slot.episodes >= 1 and busy:
            seen["robot"] = {"job": slot.job, "recorded": rt.store.episode_ids()}
            ray.kill(slot.actor)  # mid-episode: its episode exists only in its memory
        if "robot" in seen and "learner" not in seen and slot.episodes >= 2 and rt.version >= 4:
            seen["learner"] = {"version": rt.version}
            ray.kill(rt.learner)
        return (
            "learner" in seen
            and slot.episodes >= 3
            and rt.version >= seen["learner"]["version"] + 4
        )

    result = run_fleet(job(run, "fleet.robots=2"), until=until)
    return run, result, seen


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_a_robot_killed_mid_episode_is_replaced_and_loses_nothing(killed_run):
    run, result, seen = killed_run
    killed = seen["robot"]
    store = ExperienceStore.open_read(run / "store")
    ids = store.episode_ids()
    assert result["robot_restarts"] == 1 and len(ids) == result["episodes"]
    assert len(set(ids)) == len(ids)  # nothing recorded twice
    assert ids[: len(killed["recorded"])] == killed["recorded"]  # nothing recorded was lost
    assert ids.count(killed["job"][0]) == 1  # the interrupted episode was run again, once
    redo = store.read([ids.index(killed["job"][0])])[0]
    assert redo.seed == killed["job"][1] and redo.robot == 0 and whole(redo)
    assert all(whole(e) for e in store.read())
    robots = Counter(e.robot for e in store.read())
    assert robots[0] >= 3 and robots[1] >= 3  # both kept running
    from rlpost.robot.lerobot_data import load_lerobot_dataset  # the LeRobotDataset holds them too

    assert [e.episode_id for e in load_lerobot_dataset(store.current)] == ids


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_a_killed_learner_resumes_from_its_checkpoint_and_the_store(killed_run):
    run, result, seen = killed_run
    assert result["learner_restarts"] == 1
    store = ExperienceStore.open_read(run / "store")
    state = json.loads((run / "checkpoints" / "latest.json").read_text())
    fleet = json.loads((run / "checkpoints" / state["dir"] / "state.json").read_text())["fleet"]
    # the final checkpoint's accounting covers every store episode exactly once
    assert fleet["watermark"] == len(store)
    counted = fleet["accepted"] + fleet["stale"]
    assert sorted(counted) == list(range(len(store))) and len(set(counted)) == len(counted)
    assert fleet["version"] > seen["learner"]["version"]  # versions grew after the restart
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    versions = [r["version"] for r in rows]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert rows[-1]["fleet/learner_restarts"] == 1


def test_the_fleet_command_runs_and_refuses_a_used_run_dir(local_ray, tmp_path, capsys):
    """The command end to end (on the module's Ray): its table, the plot, the policy and
    the LeRobotDataset; a second run into the same directory is refused."""
    from rlpost.apps.robot.cli import main

    run = tmp_path / "run"
    args = ["fleet", "--robots", "2", "--minutes", "0.1", *SMALL, f"run.dir={run}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "success without intervention, 2 held-out episodes per variant" in out
    assert "LeRobotDataset" in out and (run / "fleet.png").is_file()
    result = json.loads((run / "fleet.json").read_text())
    assert set(result["before"]) == set(result["after"]) == {"nominal", "weak"}
    assert result["episodes"] == len(ExperienceStore.open_read(run / "store")) > 0
    assert (run / "policy" / "model.safetensors").is_file()
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    other = [*args[:-1], f"run.dir={tmp_path / 'other'}", "robot.type=no_such_arm"]
    assert main(other) == 2  # the robots' lerobot type is checked before anything starts
    assert "unknown lerobot robot 'no_such_arm'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_fleet_command_killed_then_resumed_continues_the_run(local_ray, tmp_path, capsys):
    """SIGKILL the whole ``rlpost-robot fleet`` process once it has stored episodes and a
    checkpoint; ``--resume`` recovers the store, resumes the learner from its checkpoint
    and continues the episode ids; the table and the LeRobotDataset come out at the end."""
    from rlpost.apps.robot.cli import main

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLPOST_CACHE": local_ray}
    args = ["fleet", "--robots", "2", *SMALL, f"run.dir={run}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.apps.robot.cli", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    latest, spool = run / "checkpoints" / "latest.json", run / "store" / "spool"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        step = json.loads(latest.read_text())["step"] if latest.is_file() else 0
        if step >= 2 and spool.is_dir() and len(list(spool.glob("ep-*"))) >= 4:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run must be killed, not finish"
    before = ExperienceStore.open_read(run / "store").episode_ids()
    assert main(args) == 2  # one run per run directory
    assert "--resume" in capsys.readouterr().err
    # resumed in this process (on the module's Ray): the budget is the run's total, so
    # give it a few seconds more than it had spent when it was killed
    spent = json.loads((run / "fleet_state.json").read_text())["elapsed"]
    assert main([*args, "--minutes", f"{(spent + 6) / 60:.4f}", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "success without intervention" in out and "LeRobotDataset" in out
    store = ExperienceStore.open_read(run / "store")
    ids = store.episode_ids()
    assert ids[: len(before)] == before and len(ids) > len(before)
    assert len(set(ids)) == len(ids) and min(ids[len(before) :]) > max(before)
    result = json.loads((run / "fleet.json").read_text())
    assert result["episodes"] == len(ids) and (run / "fleet.png").is_file()
    assert (run / "policy" / "model.safetensors").is_file()


OTHER_FLEETS = [p.stem for p in sorted(recipes_dir("fleet").glob("*.yaml"))]
OTHER_FLEETS.remove("lwd_multimodal_reach")  # (the command test above runs it)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", OTHER_FLEETS)
def test_every_fleet_recipe_runs_its_algorithm_end_to_end(local_ray, tmp_path, recipe, capsys):
    """Each other shipped fleet recipe (OTQL's) through ``rlpost-robot fleet``: the learner
    it names trains on the fleet's episodes and its policy comes out."""
    from rlpost.apps.robot.cli import main

    algo = load_job("fleet", recipe_path(recipe, "fleet")).learner.algo
    small = [o for o in SMALL if not o.startswith("learner.params.")]
    small += ["learner.params.batch_size=16", "learner.params.hidden=32"]
    small += ["learner.params.sample_steps=3", "learner.max_staleness=1000"]
    if algo == "otql":
        small += ["learner.params.critic_pretrain_steps=3", "learner.params.k_samples=4"]
    args = ["fleet", "--config", recipe, "--robots", "2", "--minutes", "0.1", *small]
    assert main([*args, f"run.dir={tmp_path}/run"]) == 0
    assert f"learner ({algo}): policy v" in capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "fleet.json").read_text())
    assert result["algo"] == algo and result["accepted"] > 0 and result["updates"] > 0
    assert (tmp_path / "run" / "policy" / "model.safetensors").is_file()
