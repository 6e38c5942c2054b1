import pytest

from rlpost.apps.llm.cli import main


def test_presets_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in ("grpo", "dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp", "ppo"):
        assert name in out


def test_doctor_and_bad_command(capsys):
    assert main(["doctor"]) == 0
    assert "transformers" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2
