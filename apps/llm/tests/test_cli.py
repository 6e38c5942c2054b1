import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpost.apps.llm.cli import main

EXE = str(Path(sys.executable).parent / "rlpost-llm")
FAST = [
    "model.path=tiny-random",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "data.eval_size=8",
    "reward.workers=1",
    "run.threads=1",
    "run.progress=false",
    "run.tensorboard=false",
]


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("grpo", "dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp", "ppo"):
        assert name in out


def test_bad_config_exits_2_naming_the_field(capsys):
    assert main(["train", "--config", "grpo_arithmetic", "optim.lrr=1"]) == 2
    assert "optim.lrr: unknown field" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2


def test_a_torchrun_rank_ends_without_interpreter_teardown(tmp_path):
    """Under a launcher (``WORLD_SIZE`` > 1) a command's output is whole and its exit code
    kept, but no exit handler runs: the process ends before the interpreter's teardown,
    which torch's C++ threads could meet (``rlpost.llm.train.parallel.end_rank``). One
    process tears down as usual."""
    (tmp_path / "exit_probe.py").write_text(
        "import atexit\natexit.register(print, 'torn down', flush=True)\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))

    def run(world: str, *args: str, exe=(EXE,)) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": path, "WORLD_SIZE": world}
        cmd = [*exe, "--import", "exit_probe", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    one, rank = run("1", "presets"), run("2", "presets")
    assert one.returncode == rank.returncode == 0, rank.stderr[-2000:]
    assert one.stdout.endswith("torn down\n")
    assert rank.stdout == one.stdout.removesuffix("torn down\n") and "grpo" in rank.stdout
    module = (sys.executable, "-m", "rlpost.apps.llm.cli")  # (torchrun -m's form)
    bad = run("2", "train", "--config", "grpo_arithmetic", "optim.lrr=1", exe=module)
    assert bad.returncode == 2 and "optim.lrr: unknown field" in bad.stderr
    assert "torn down" not in bad.stdout


def test_main_called_in_process_returns_under_a_launcher(monkeypatch, capsys):
    """Only the command ends a rank's process: ``main()`` called from a user's script
    under torchrun returns its code."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["presets"]) == 0 and "grpo" in capsys.readouterr().out


def test_demo_then_eval_end_to_end(tmp_path):
    """The demo's code path (console script, shipped recipe, reward workers, plot, summary)
    on the untrained tiny model for two steps, then `eval` on its last checkpoint."""
    out = tmp_path / "demo"
    proc = subprocess.run(
        [
            EXE,
            "demo",
            "--out",
            str(out),
            "--steps",
            "2",
            *FAST,
            "run.save_every=2",
            "run.eval_every=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out greedy accuracy:" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and (out / "curves.png").exists()
    ev = subprocess.run(
        [
            EXE,
            "eval",
            "--config",
            "grpo_arithmetic",
            "--checkpoint",
            str(out / "checkpoints/step-000002"),
            "--samples",
            "2",
            *FAST,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "greedy_accuracy" in ev.stdout and "pass@2" in ev.stdout
