"""``--overwrite`` never destroys a live run: every command and runtime takes its run
directory's lock before it deletes or reads anything there (the fleet, and the root of a
Mutual RL, CoPD or federated run), so a second process is refused, naming the first, and
nothing of the live run is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture
def live(tmp_path):
    """A process holding ``run``'s lock, as a live run does."""
    run = tmp_path / "run"
    run.mkdir()
    code = f"""
        import time
        from pathlib import Path
        from rlpost.core.io.rundir import lock_run_dir
        lock_run_dir(Path({str(run)!r}))
        print("locked", flush=True)
        time.sleep(120)
    """
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    yield run, holder.pid
    holder.kill()
    holder.wait()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".lock")


def test_overwriting_a_live_fleet_is_refused_and_nothing_is_deleted(live):
    from rlpost.core.io.rundir import RunDirError
    from rlpost.robot.fleet.job import _claim

    run, pid = live
    for name in ("store/spool/episode-000000.safetensors", "robots/0/state.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("a live run's")
    before = _files(run)
    job = SimpleNamespace(run=SimpleNamespace(dir=str(run)), to_yaml=lambda: "")
    with pytest.raises(RunDirError, match=rf"in use by pid {pid}"):
        _claim(job, resume=False, overwrite=True)
    assert _files(run) == before


@pytest.mark.parametrize("sub, what", [("policies", "Mutual RL"), ("experts", "CoPD")])
def test_overwriting_a_live_multi_policy_run_is_refused_and_nothing_is_deleted(live, sub, what):
    from rlpost.core.io.rundir import RunDirError
    from rlpost.llm.rollout.cluster import claim_run_dir

    run, pid = live
    ckpt = run / sub / "a" / "checkpoints" / "step-000002" / "model.safetensors"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_text("a live run's")
    before = _files(run)
    with pytest.raises(RunDirError, match=rf"in use by pid {pid}"):
        claim_run_dir(run, sub, what, resume=False, overwrite=True)
    assert _files(run) == before


def test_a_federated_run_takes_its_root_before_reading_it(live):
    from rlpost.core.io.rundir import RunDirError
    from rlpost.llm.config import load_config
    from rlpost.llm.runtimes.federated import run_federated

    run, pid = live
    (run / "federated.json").write_text("{}")  # a finished run, being replaced by another
    cfg = load_config(None, ["federated={backend: local}", f"run.dir={run}"])
    with pytest.raises(RunDirError, match=rf"in use by pid {pid}"):
        run_federated(cfg, progress=False, overwrite=True)
    assert (run / "federated.json").read_text() == "{}"
