import json
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
