"""Every console script is installed, reports its version and lists its engines."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

APPS = {"llm": "transformers", "diffusion": "diffusers", "robot": "mujoco"}


@pytest.mark.parametrize("domain", sorted(APPS))
def test_console_script_version_and_doctor(domain, capsys):
    exe = Path(sys.executable).parent / f"rlpost-{domain}"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"rlpost-{domain} 0.1.0"
    main = importlib.import_module(f"rlpost.apps.{domain}.cli").main
    assert main(["doctor"]) == 0
    report = capsys.readouterr().out
    assert "torch" in report and APPS[domain] in report
