import subprocess
import sys
from pathlib import Path

from rlpost.apps.diffusion.cli import main


def test_doctor_prints_engine_versions(capsys):
    assert main(["doctor"]) == 0
    assert "diffusers" in capsys.readouterr().out


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "rlpost-diffusion"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "rlpost-diffusion 0.1.0"
