import sys

import pytest

from rlpost.apps.common import App


def _app(calls: list) -> App:
    app = App("rlpost-toy", "a toy app", "9.9", lambda: {"torch": "2.0", "engine": "1.2"})

    def run(args):
        calls.append((args.config, args.overrides))
        if args.config == "bad":
            raise ValueError("config: bad recipe")
        if args.config == "missing":
            raise FileNotFoundError("no file 'missing'")
        if args.config == "bug":
            raise KeyError("a bug, not bad input")
        return 0

    app.command("train", run, "train", config="toy_recipe")
    return app


def test_subcommand_gets_config_and_overrides():
    calls = []
    assert _app(calls).main(["train", "--config", "x.yaml", "a.b=1", "c=2"]) == 0
    assert calls == [("x.yaml", ["a.b=1", "c=2"])]


def test_doctor_and_version(capsys):
    app = _app([])
    assert app.main(["doctor"]) == 0
    assert capsys.readouterr().out.split() == ["torch", "2.0", "engine", "1.2"]
    with pytest.raises(SystemExit):
        app.main(["--version"])
    assert capsys.readouterr().out.strip() == "rlpost-toy 9.9"


def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("RLPOST_TRACEBACK", raising=False)
    app = _app([])
    assert app.main(["train", "--config", "bad"]) == 2
    assert capsys.readouterr().err == "rlpost-toy: config: bad recipe\n"
    assert app.main(["train", "--config", "missing"]) == 2
    assert "no file 'missing'" in capsys.readouterr().err
    with pytest.raises(KeyError):  # a bug keeps its traceback
        app.main(["train", "--config", "bug"])
    monkeypatch.setenv("RLPOST_TRACEBACK", "1")
    with pytest.raises(ValueError, match="bad recipe"):
        app.main(["train", "--config", "bad"])


def test_import_runs_a_users_module_first(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_plugin_for_app_test.py").write_text("import sys\nsys.registered = 'yes'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "registered", "no", raising=False)
    seen = []
    app = App("rlpost-toy", None, "1", dict)
    app.command("show", lambda args: seen.append(__import__("sys").registered) or 0, "")
    assert app.main(["--import", "my_plugin_for_app_test", "show"]) == 0
    assert seen == ["yes"]
    assert app.main(["--import", "no_such_module_xyz", "show"]) == 2
    assert "--import no_such_module_xyz" in capsys.readouterr().err
