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


def test_train_recipe_with_overrides_and_config_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    small = [
        "otql.episodes=2",
        "otql.envs=2",
        "otql.updates_per_round=2",
        "otql.critic_pretrain_steps=5",
        "policy.bc_steps=20",
        "policy.hidden=32",
        "demos.n_good=2",
        "demos.n_poor=2",
        "run.eval_episodes=2",
        "run.eval_steps=[1]",
        "run.progress=false",
        f"run.dir={run}",
    ]
    assert main(["train", "--config", "otql_reacher", *small]) == 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 1  # one OTQL round
    assert (run / "config.yaml").is_file() and (run / "policy" / "config.json").is_file()
    capsys.readouterr()
    assert main(["train", "--config", "otql_reacher", "task=walker"]) == 2
    assert "task" in capsys.readouterr().err
    assert main(["train", "--config", "otql_reacher", "otql.coupling=sinkhorn"]) == 2


def _small_run(tmp_path, algo: str) -> list[str]:
    common = ["demos.n_good=2", "demos.n_poor=2", "run.eval_episodes=2", "run.progress=false"]
    per_algo = {
        "pac_act": [
            "pac_act.episodes=2",
            "pac_act.envs=2",
            "pac_act.updates_per_round=2",
            "pac_act.critic_pretrain_steps=2",
            "policy.bc_steps=10",
            "policy.dim_model=16",
        ],
        "craft": ["craft.episodes=4", "craft.envs=2", "policy.bc_steps=20", "policy.hidden=32"],
    }
    return [*common, *per_algo[algo], f"run.dir={tmp_path / algo}"]


def test_train_pac_act_and_craft_recipes(tmp_path, monkeypatch, capsys):
    """PAC-ACT (ACT on contour, force metrics) and CRAFT recipes end to end at toy size."""
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--config", "pac_act_contour", *_small_run(tmp_path, "pac_act")]) == 0
    text = capsys.readouterr().out
    assert "after PAC-ACT" in text and "peak contact force" in text
    assert '"kind": "act"' in (tmp_path / "pac_act" / "policy" / "config.json").read_text()
    craft = _small_run(tmp_path, "craft")
    assert main(["train", "--config", "craft_multimodal_reach", *craft]) == 0
    assert "after CRAFT" in capsys.readouterr().out
    assert (tmp_path / "craft" / "metrics.jsonl").read_text().count("\n") == 2  # two rounds
    assert main(["train", "--config", "craft_multimodal_reach", "policy.kind=flow"]) == 2
