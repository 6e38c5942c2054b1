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
