"""RELEX (000-12): exact on a synthetic linear trajectory, the rank-1 share of the deltas'
energy, and extrapolated checkpoints that load with ``from_pretrained``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model

from rlpost.core.extrapolate import fit
from rlpost.llm.config import load_config
from rlpost.llm.model.policy import load_policy
from rlpost.llm.tools.relex import relex
from rlpost.llm.tools.weights import checkpoint_steps
from rlpost.llm.trainer import Trainer


def test_the_fit_is_exact_on_a_linear_rank1_trajectory_and_extrapolates():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, generator=g)
    steps = torch.tensor([2.0, 4, 6])
    f = fit((0.3 + 1.5 * steps)[:, None] * w, steps)  # Delta_t = (a + b t) w
    assert f.energy == pytest.approx(1.0) and f.r2 == pytest.approx(1.0)
    assert torch.allclose(f.at(40.0), (0.3 + 60.0) * w, atol=1e-3)  # far beyond the window
    assert f.intercept == pytest.approx(0.3 * float(w.norm()), rel=1e-4)
    noise = 1.5 * steps[:, None] * w + 0.01 * torch.randn(3, 50, generator=g)
    noisy = fit(noise, steps)
    assert 0.99 < noisy.energy < 1.0 and abs(noisy.slope - 1.5 * float(w.norm())) < 0.05
    two = fit(torch.stack([steps * 0 + 1, steps]).T @ torch.randn(2, 50, generator=g), steps)
    assert two.energy < 0.999  # a rank-2 trajectory: the direction holds less


def test_the_coefficient_grows_along_the_direction_whatever_the_svd_sign():
    steps = torch.tensor([0.0, 1, 2])
    w = torch.tensor([1.0, -2.0])
    for s in (1.0, -1.0):
        f = fit(s * steps[:, None] * w, steps)
        assert f.slope > 0 and torch.allclose(f.at(3.0), s * 3 * w, atol=1e-5)


def test_a_run_extrapolates_to_checkpoints_that_load_with_from_pretrained(fast_cfg, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = fast_cfg("train.steps=3", "run.save_every=1", "run.keep_checkpoints=5")
    Trainer(cfg).train()
    run = Path(cfg.run.dir)
    base, _ = load_policy(load_config(str(run / "config.yaml"), []), progress=False)
    g = torch.Generator().manual_seed(1)
    keys = load_file(str(checkpoint_steps(run)[0][1] / "model.safetensors")).keys()  # (tied: one)
    w = {k: torch.randn(base.state_dict()[k].shape, generator=g) * 1e-3 for k in keys}
    for step, folder in checkpoint_steps(run):  # a planted linear trajectory: theta_0 + t w
        model = type(base)(base.config)
        model.load_state_dict(base.state_dict())
        model.load_state_dict({k: base.state_dict()[k] + step * w[k] for k in keys}, strict=False)
        save_model(model, str(folder / "model.safetensors"))
    out = tmp_path / "relex"
    report = relex(run, upto=3, targets=[10], out=out)
    assert report["observed_steps"] == [1, 2, 3] and report["energy"] == pytest.approx(1.0)
    assert all(t["r2"] == pytest.approx(1.0, abs=1e-6) for t in report["tensors"].values())
    folder = out / "step-000010"
    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    written = load_file(str(folder / "model.safetensors"))
    for k in keys:
        want = base.state_dict()[k] + 10 * w[k]
        assert torch.allclose(loaded[k], want, atol=1e-5), k
        assert torch.allclose(written[k], want, atol=1e-5), k
    assert json.loads((out / "relex.json").read_text())["written"]["10"] == str(folder)


def test_a_window_without_two_checkpoints_is_refused_in_one_line(fast_cfg, tmp_path):
    cfg = fast_cfg("train.steps=2", "run.save_every=2")
    Trainer(cfg).train()
    with pytest.raises(ValueError, match="need at least 2"):
        relex(cfg.run.dir, upto=2, targets=[5], out=tmp_path / "x")


def test_the_weight_tools_run_from_the_cli_and_refuse_a_non_run_in_one_line(
    fast_cfg, tmp_path, capsys
):
    from rlpost.apps.llm.cli import main

    cfg = fast_cfg("train.steps=3", "run.save_every=1", "run.keep_checkpoints=5")
    Trainer(cfg).train()
    run = str(cfg.run.dir)
    assert main(["relex", run, "--upto", "2", "--to", "6", "--out", str(tmp_path / "rx")]) == 0
    assert "of the deltas' energy" in capsys.readouterr().out
    assert (tmp_path / "rx" / "step-000006" / "config.json").is_file()
    assert main(["sar", run, "--rank", "2", "--out", str(tmp_path / "sar")]) == 0
    assert "of the parameters" in capsys.readouterr().out
    assert (tmp_path / "sar" / "sar.json").is_file()
    assert main(["relex", str(tmp_path), "--upto", "2", "--to", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no config.yaml" in err[0]
