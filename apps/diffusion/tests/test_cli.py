from rlpost.apps.diffusion.cli import main


def test_demo_end_to_end_smoke(tmp_path, monkeypatch, capsys):
    """The demo's whole path on the real embedded model (built into a fresh cache), 2 steps."""
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    overrides = ["run.eval_every=1", "run.eval_per_prompt=1", "run.tensorboard=false"]
    assert main(["demo", "--out", str(out), "--steps", "2", *overrides]) == 0
    text = capsys.readouterr().out
    assert "ram" in text and "flow_grpo" in text and "steps to peak" in text
    for name in ("samples.png", "samples_after_ram.png", "reward_curves.png", "demo.json"):
        assert (out / name).is_file(), name


def test_train_resume_and_eval_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    small = [
        "model.name=digits-random",
        "reward.name=hackable",
        "prompts.per_step=2",
        "prompts.group_size=2",
        "sampler.steps=2",
        "sampler.eval_steps=2",
        "run.eval_per_prompt=1",
        "run.progress=false",
        f"run.dir={run}",
    ]
    assert main(["train", "--config", "awm_digits", "train.steps=1", *small]) == 0
    assert main(["train", "--config", "awm_digits", "--resume", "train.steps=2", *small]) == 0
    ckpt = run / "checkpoints" / "step-000002"
    assert main(["eval", "--config", "awm_digits", "--checkpoint", str(ckpt), *small]) == 0
    assert "eval/reward" in capsys.readouterr().out


def test_bad_config_exits_2_naming_the_field(capsys):
    assert main(["train", "--config", "ram_digits", "algo.method=ppo"]) == 2
    assert "algo.method" in capsys.readouterr().err
    assert main(["train", "--config", "no_such_recipe"]) == 2


def test_a_method_registered_by_the_test_trains_through_the_cli(tmp_path, monkeypatch):
    """A new method is one function and one registration: no package file is touched."""
    from dataclasses import dataclass

    import torch

    from rlpost.core.contract import Input
    from rlpost.core.presets import Choice
    from rlpost.diffusion.methods import METHODS, LossOutput, Method, register_method

    seen = {}

    @dataclass(frozen=True)
    class ToyParams:
        pull: float = 0.5

    def toy(inp, p):  # regress halfway between the reference and the flow target
        seen.update(params=p, has_ref=inp.v_ref is not None, adv=inp.advantages)
        target = p.pull * inp.v_ref + (1 - p.pull) * inp.target
        return LossOutput(((inp.v - target.detach()) ** 2).flatten(1).mean(1), {"toy": 1.0})

    register_method(
        Method(
            name="toy_pull",
            paper="a test",
            sampler=Choice("ode"),
            family=Choice("renoise"),
            advantage=Choice("rloo"),
            loss=toy,
            params=ToyParams,
            needs=frozenset({Input.REF_VELOCITY}),
        )
    )
    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path / "cache"))
    try:
        small = [
            "model.name=digits-random",
            "reward.name=hackable",
            "prompts.per_step=2",
            "prompts.group_size=2",
            "sampler.steps=2",
            "sampler.eval_steps=2",
            "run.eval_per_prompt=1",
            "run.progress=false",
            f"run.dir={tmp_path / 'run'}",
            "train.steps=1",
        ]
        args = ["train", "--config", "awm_digits", "algo.method=toy_pull", "algo.params.pull=0.25"]
        assert main([*args, *small]) == 0
        assert seen["params"].pull == 0.25 and seen["has_ref"]
        assert torch.isfinite(seen["adv"]).all()
    finally:
        METHODS.unregister("toy_pull")


def test_a_bad_device_stops_the_demo_before_it_writes_anything(tmp_path, capsys):
    import torch

    device = "tpu" if torch.cuda.is_available() else "cuda"
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), f"run.device={device}"]) == 2
    assert f"device '{device}'" in capsys.readouterr().err
    assert not out.exists()
