import subprocess
import sys
from pathlib import Path

from rlpost.apps.robot.cli import main


def test_doctor_prints_engine_versions(capsys):
    assert main(["doctor"]) == 0
    assert "mujoco" in capsys.readouterr().out


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "rlpost-robot"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "rlpost-robot 0.1.0"


def test_demo_end_to_end_smoke(tmp_path, monkeypatch, capsys):
    """The demo's whole path (demo set, BC, OTQL, evaluation, plots) at toy size."""
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    args = [
        "demo",
        "--out",
        str(out),
        "--episodes",
        "4",
        "--eval-episodes",
        "4",
        "--bc-steps",
        "50",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "after OTQL" in text and "integration steps" in text
    assert (out / "success.png").is_file() and (out / "demo.json").is_file()
    assert (out / "policy" / "model.safetensors").is_file()


def test_tasks_and_bad_task(capsys):
    assert main(["tasks"]) == 0
    assert "contour" in capsys.readouterr().out
    assert main(["build-base", "--task", "walker"]) == 2
