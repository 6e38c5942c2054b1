"""The run-directory discipline: lock, refusal, stale leftovers, checkpoint fallback."""

import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from rlpost.core.io.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    validate_checkpoint,
)
from rlpost.core.io.rundir import (
    RunDirError,
    locked_here,
    open_run_dir,
    releases_run_dir,
    resume_checkpoint,
    unlock_run_dir,
)
from rlpost.core.io.schema import CheckpointedRunConfig

CFG = CheckpointedRunConfig(seed=1)


def _model():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    return m, torch.optim.AdamW(m.parameters(), lr=0.1)


def test_a_second_process_on_a_locked_run_dir_fails_at_once_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, time
                from rlpost.core.io.rundir import open_run_dir
                from rlpost.core.io.schema import CheckpointedRunConfig
                open_run_dir({str(run)!r}, CheckpointedRunConfig())
                print("locked", flush=True)
                time.sleep(60)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(RunDirError, match=rf"in use by pid {holder.pid} on .*wait for it"):
            open_run_dir(run, CFG, resume=True)
        assert time.monotonic() - t0 < 1.0
    finally:
        holder.kill()
        holder.wait()
    # the lock died with its holder: no stale lock
    assert open_run_dir(run, CFG, resume=True) == run
    unlock_run_dir(run)


def _lock_elsewhere(run) -> str:
    """What another process says when it tries to take ``run``'s lock."""
    code = f"""
        from rlpost.core.io.rundir import RunDirError, lock_run_dir
        try:
            lock_run_dir({str(run)!r})
            print("took it")
        except RunDirError as exc:
            print(exc)
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_released_run_dir_is_free_for_another_process_while_this_one_lives(tmp_path):
    """A trainer releases its run directory when the run has ended: a process that lives on
    (a notebook, a sweep) no longer keeps another process from resuming or replacing it,
    nor holds a descriptor per finished run. Re-entrant: a second take is the same lock."""
    run = open_run_dir(tmp_path / "run", CFG)
    open_run_dir(run, CFG, resume=True)  # (the same lock, taken again in this process)
    assert locked_here(run)
    assert "in use by pid" in _lock_elsewhere(run)
    unlock_run_dir(run)
    assert not locked_here(run)
    assert _lock_elsewhere(run) == "took it"
    unlock_run_dir(run)  # (releasing what this process does not hold does nothing)


def test_a_decorated_run_releases_its_directory_when_it_returns_or_raises(tmp_path):
    @releases_run_dir(lambda run, fail: run)
    def train(run, fail):
        open_run_dir(run, CFG, resume=True)
        assert locked_here(run)
        if fail:
            raise OSError("disk full")
        return "done"

    assert train(tmp_path / "a", False) == "done" and not locked_here(tmp_path / "a")
    with pytest.raises(OSError, match="disk full"):
        train(tmp_path / "b", True)
    assert not locked_here(tmp_path / "b")


def test_a_used_run_dir_needs_resume_or_overwrite(tmp_path):
    run = open_run_dir(tmp_path / "run", CFG)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics.jsonl\); pass --resume"):
        open_run_dir(run, CFG)
    open_run_dir(run, CFG, resume=True)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'  # resume keeps it
    m, o = _model()
    save_checkpoint(run / "checkpoints", 1, m, o, None, {})
    (run / "notes.txt").write_text("mine")
    open_run_dir(run, CFG, overwrite=True)
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert (run / "notes.txt").read_text() == "mine"  # only a run's outputs are replaced
    unlock_run_dir(run)


def test_leftovers_of_interrupted_writes_are_removed_on_start(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000004.tmp-99999").mkdir(parents=True)
    (run / "checkpoints" / "latest.json.tmp-99999").write_text("{")
    (run / "config.yaml.tmp-99999").write_text("x")
    open_run_dir(run, CFG, resume=True)
    assert not list(run.rglob("*.tmp-*"))
    assert "removed 3 leftover(s)" in capsys.readouterr().err
    unlock_run_dir(run)


def _two_checkpoints(root):
    m, o = _model()
    for step in (9, 10):
        m(torch.randn(4, 3)).sum().backward()
        o.step()
        save_checkpoint(root, step, m, o, None, {"at": step}, keep=3)
    return m, o


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda c: c.joinpath("model.safetensors").write_bytes(b"\x08"), "model.safetensors is"),
        (
            lambda c: c.joinpath("optimizer.safetensors").write_bytes(
                c.joinpath("optimizer.safetensors").read_bytes()[:-7]
            ),
            "optimizer.safetensors is",
        ),
        (lambda c: c.joinpath("state.json").write_text(""), "state.json is"),
        (lambda c: c.joinpath("rng.safetensors").unlink(), "rng.safetensors is missing"),
    ],
)
def test_resume_falls_back_to_the_newest_checkpoint_that_validates(tmp_path, capsys, damage, why):
    root = tmp_path / "run" / "checkpoints"
    _two_checkpoints(root)
    assert validate_checkpoint(root / "step-000010") is None
    damage(root / "step-000010")
    assert why in validate_checkpoint(root / "step-000010")
    ckpt = resume_checkpoint(tmp_path / "run")
    assert ckpt.name == "step-000009"
    err = capsys.readouterr().err
    assert f"skipped step-000010: {why}" in err and "resuming from step-000009" in err
    m, o = _model()
    assert load_checkpoint(ckpt, m, o, None)["at"] == 9


def test_a_garbled_or_dangling_latest_pointer_is_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    _two_checkpoints(root)
    (root / "latest.json").write_text("{garbled")
    ckpt, notes = find_checkpoint(root)
    assert ckpt.name == "step-000010" and notes == ["latest.json is garbled"]
    (root / "latest.json").write_text(json.dumps({"step": 11, "dir": "step-000011"}))
    ckpt, notes = find_checkpoint(root)
    assert ckpt.name == "step-000010" and "step-000011, which does not exist" in notes[0]
    assert find_checkpoint(tmp_path / "none") == (None, [])


def test_named_generators_are_saved_and_restored(tmp_path):
    m, o = _model()
    gen = torch.Generator().manual_seed(7)
    torch.rand(3, generator=gen)  # advance it
    save_checkpoint(tmp_path, 1, m, o, None, {}, generators={"env": gen})
    expected = torch.rand(5, generator=gen)
    other = torch.Generator().manual_seed(123)
    load_checkpoint(tmp_path / "step-000001", m, o, None, generators={"env": other})
    assert torch.equal(torch.rand(5, generator=other), expected)
    with pytest.raises(FileNotFoundError, match="no state of generator 'sampler'"):
        load_checkpoint(tmp_path / "step-000001", m, o, None, generators={"sampler": other})


def _flip(f) -> None:
    """One bit of ``f``'s last byte flipped: the same size, one value changed."""
    b = bytearray(f.read_bytes())
    b[-1] ^= 0x40
    f.write_bytes(bytes(b))


def test_a_flipped_bit_in_a_checkpoint_is_caught_and_the_run_falls_back(tmp_path, capsys):
    root = tmp_path / "run" / "checkpoints"
    _two_checkpoints(root)
    _flip(root / "step-000010" / "model.safetensors")  # a weight changed, sizes all intact
    why = validate_checkpoint(root / "step-000010")
    assert (
        why == "model.safetensors does not match the digest it was written with (it changed since)"
    )
    assert resume_checkpoint(tmp_path / "run").name == "step-000009"
    assert (root / "step-000010.damaged").is_dir() and not (root / "step-000010").exists()
    assert "moved the damaged step-000010 aside: step-000010.damaged" in capsys.readouterr().err


def test_a_run_whose_checkpoints_are_all_damaged_keeps_its_new_progress(tmp_path):
    """Both kept checkpoints damaged: the run restarts at step 0; its new checkpoints must
    survive the rotation, so that a second crash resumes from them."""
    root = tmp_path / "run" / "checkpoints"
    _two_checkpoints(root)
    for step in (9, 10):
        _flip(root / f"step-{step:06d}" / "model.safetensors")
    assert resume_checkpoint(tmp_path / "run") is None
    m, o = _model()
    for step in (1, 2):
        save_checkpoint(root, step, m, o, None, {"at": step}, keep=2)
    assert resume_checkpoint(tmp_path / "run").name == "step-000002"
    assert (root / "step-000001").is_dir()


def test_the_rotation_never_deletes_the_checkpoint_it_just_wrote(tmp_path):
    root = tmp_path / "checkpoints"
    _two_checkpoints(root)  # steps 9 and 10, not set aside (no resume ran)
    m, o = _model()
    save_checkpoint(root, 1, m, o, None, {}, keep=2)  # a run restarted below them
    assert (root / "step-000001").is_dir()
    for step in (2, 3):
        save_checkpoint(root, step, m, o, None, {}, keep=2)
    assert not (root / "step-000001").exists() and (root / "step-000002").is_dir()


def test_a_wrong_shaped_state_or_a_missing_optimiser_file_is_skipped(tmp_path):
    root = tmp_path / "checkpoints"
    _two_checkpoints(root)
    c = root / "step-000010"
    (c / "manifest.json").unlink()  # (checkpoints of older versions have no manifest)
    (c / "state.json").write_text(json.dumps([1, 2, 3]))
    assert validate_checkpoint(c) == "state.json is not a trainer state (no integer step)"
    (c / "state.json").write_text(json.dumps({"step": 10}))
    (c / "optimizer.json").unlink()
    assert validate_checkpoint(c) == "optimizer.json is missing"
    assert find_checkpoint(root)[0].name == "step-000009"
