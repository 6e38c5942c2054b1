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


BAD_CONFIGS = {
    "unclosed.yaml": ("a: [1, 2\nb: 3\n", r"unclosed.yaml:2:2: malformed YAML: expected ','"),
    "list.yaml": ("- a\n- b\n", r"list.yaml: the top level must be a mapping .* got a list"),
    "interp.yaml": ("run:\n  dir: ${nope.x}\n", r"interp.yaml: Interpolation key 'nope.x'"),
    "indent.yaml": ("run:\n dir: x\n  seed: 1\n", r"indent.yaml:3:7: malformed YAML: mapping"),
    "binary.yaml": (b"\xff\xfe\x00", r"binary.yaml: not a text file"),
}


@pytest.mark.parametrize("domain", sorted(APPS))
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_a_malformed_config_is_one_line_and_exit_2(domain, name, tmp_path, capsys):
    import re

    text, expected = BAD_CONFIGS[name]
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    main = importlib.import_module(f"rlpost.apps.{domain}.cli").main
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(expected, err), err


@pytest.mark.parametrize("domain", sorted(APPS))
def test_a_malformed_override_is_one_line_and_exit_2(domain, capsys):
    main = importlib.import_module(f"rlpost.apps.{domain}.cli").main
    assert main(["train", "--config", _recipe(domain), "a=[1"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"rlpost-{domain}: override 'a=[1': malformed value: did not find expected ',' or ']'"
    )
    assert main(["train", "--config", _recipe(domain), "run.dir=${oops}"]) == 2
    assert "Interpolation key 'oops' not found" in capsys.readouterr().err


def _recipe(domain):
    return {"llm": "grpo_arithmetic", "diffusion": "ram_digits", "robot": "otql_reacher"}[domain]


def test_flags_and_overrides_mix_in_any_order():
    from rlpost.apps.llm.cli import build_app

    app = build_app()
    seen = {}
    app.sub.choices["train"].set_defaults(fn=lambda a: seen.update(vars(a)) or 0)
    assert app.main(["train", "--config", "x", "a=1", "--resume", "b=2", "c.d=3"]) == 0
    assert seen["overrides"] == ["a=1", "b=2", "c.d=3"] and seen["resume"] is True
    with pytest.raises(SystemExit):
        app.main(["train", "--resume", "--overwrite"])
    with pytest.raises(SystemExit):
        app.main(["train", "--bogus"])


def test_a_run_that_stops_on_purpose_is_one_line_and_exit_3(capsys):
    from rlpost.apps.llm.cli import build_app
    from rlpost.core.guard import RunStopped

    app = build_app()

    def stop(_):
        raise RunStopped("3 steps in a row skipped, the last because x")

    app.sub.choices["train"].set_defaults(fn=stop)
    assert app.main(["train"]) == 3
    err = capsys.readouterr().err
    assert err == "rlpost-llm: stopped: 3 steps in a row skipped, the last because x\n"

    def bug(_):
        raise RuntimeError("a bug")  # not marked one_line: the traceback is kept

    app.sub.choices["train"].set_defaults(fn=bug)
    with pytest.raises(RuntimeError, match="a bug"):
        app.main(["train"])
