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


def test_a_run_reports_its_whole_time_not_only_the_training_loop(capsys):
    """Before: '2 steps in 1 s' closed a 23-53 s command (set-up and evaluation uncounted)."""
    import time

    from rlpost.apps.llm.cli import build_app

    app = build_app()

    def slow_setup(_):
        time.sleep(1.6)  # model, data, workers: not in the training loop's own count
        print("2 steps in 0 s of training")
        return 0

    app.sub.choices["train"].set_defaults(fn=slow_setup)
    t0 = time.perf_counter()
    assert app.main(["train"]) == 0
    took = time.perf_counter() - t0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("rlpost-llm train: ") and last.endswith(
        " s in all (set-up, training, evaluation, plots)"
    )
    said = int(last.split(": ")[1].split(" s")[0])
    assert round(took) - 1 <= said <= round(took)  # whole, and never more than it took


@pytest.mark.parametrize("domain", ["llm", "diffusion", "robot"])
def test_help_imports_no_torch_and_config_lists_the_keys(domain):
    """Before: --help took 8-10 s (torch, transformers imported at start) and train --help
    named no config key."""
    code = (
        f"import sys; from rlpost.apps.{domain}.cli import build_app\n"
        "app = build_app()\n"
        "try:\n    app.main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported by --help'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"rlpost-{domain} config train" in out.stdout
    listing = subprocess.run(
        [sys.executable, "-m", f"rlpost.apps.{domain}.cli", "config", "--section", "run"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert "run.dir = " in listing.stdout and "run.seed = 0" in listing.stdout


def test_config_shows_a_commands_values_with_key_value_overrides(capsys):
    """``config [COMMAND] key=value ...``: the values a run would use (before: an override
    was taken for the command name and refused)."""
    from rlpost.apps.robot.cli import main

    assert main(["config", "--section", "run.eval_episodes", "run.eval_episodes=7"]) == 0
    assert capsys.readouterr().out.strip() == "run.eval_episodes = 7"
    assert main(["config", "fleet", "--section", "run.dir", "run.dir=elsewhere"]) == 0
    assert capsys.readouterr().out.strip() == 'run.dir = "elsewhere"'
    assert main(["config", "trian"]) == 2
    assert "'trian' is not a command with a config" in capsys.readouterr().err
