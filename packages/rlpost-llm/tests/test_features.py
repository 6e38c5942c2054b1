"""The feature-level analysis tool (001-30's study) on a tiny run's two checkpoints: the
steering hook changes the layer's output by exactly what it returns, every checkpoint's
row is the feature change recomputed here from that checkpoint's own activations, and a
model compared with itself changes nothing."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpost.core import features as core_features
from rlpost.llm.tools import features as ft
from rlpost.llm.tools.weights import checkpoint_steps, run_base
from rlpost.llm.trainer import Trainer


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    from rlpost.llm.config import load_config

    from .conftest import FAST

    tmp = tmp_path_factory.mktemp("features")
    cfg = load_config(None, [*FAST, f"run.dir={tmp / 'run'}", "run.save_every=1",
                             "run.keep_checkpoints=5", "optim.lr=1e-2"])  # fmt: skip
    Trainer(cfg, reward_fn=_odd_length).train()
    _, model, tok = run_base(cfg.run.dir, "test")
    model.save_pretrained(tmp / "base")
    tok.save_pretrained(tmp / "base")
    return tmp / "base", cfg.run.dir


def test_the_hook_replaces_the_layers_output(tuned_run):
    base, _ = tuned_run
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    tok = AutoTokenizer.from_pretrained(base)
    ids = torch.tensor([tok("12+34=46", add_special_tokens=False).input_ids])
    plain, _ = ft.activations(model, tok, ["12+34=46"], 1)
    logits = model(input_ids=ids).logits
    shift = torch.linspace(-1, 1, plain.shape[1])
    with ft.steered(model, 1, lambda h: h + shift):
        moved, _ = ft.activations(model, tok, ["12+34=46"], 1)
        assert not torch.allclose(model(input_ids=ids).logits, logits)  # (it reaches the head)
    assert torch.allclose(moved, plain + shift, atol=1e-5)
    again, _ = ft.activations(model, tok, ["12+34=46"], 1)  # (the hook is gone)
    assert torch.equal(again, plain)
    with ft.steered(model, 1, lambda h: h + 0.0):
        assert torch.equal(model(input_ids=ids).logits, logits)


def test_each_checkpoints_row_is_its_own_feature_change(tuned_run, tmp_path, monkeypatch):
    base, run = tuned_run
    fitted, fit = {}, core_features.train_sae

    def capture(x, *args, **kw):
        fitted["sae"], err = fit(x, *args, **kw)
        return fitted["sae"], err

    monkeypatch.setattr(core_features, "train_sae", capture)
    report = ft.feature_study(base, [run, base], ["arithmetic"], tmp_path / "f", layer=1,
                              features=64, k=4, size=6, top=3, sae_steps=30)  # fmt: skip
    sae = fitted["sae"]
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    tok = AutoTokenizer.from_pretrained(base)
    texts = ft.Study(base, ["arithmetic"], 1, 6).texts
    codes = sae.encode(ft.activations(model, tok, texts, 1)[0])
    rows = report["runs"][str(run)]["trajectory"]
    assert [r["step"] for r in rows] == [s for s, _ in checkpoint_steps(run)] == [1, 2]
    prev = codes
    for row, (_, folder) in zip(rows, checkpoint_steps(run), strict=True):
        tuned = AutoModelForCausalLM.from_pretrained(base).eval()
        from safetensors.torch import load_model

        load_model(tuned, str(folder / "model.safetensors"), strict=False)
        now = sae.encode(ft.activations(tuned, tok, texts, 1)[0])
        want = core_features.feature_change(codes, now).summary()
        assert {k: row[k] for k in want} == pytest.approx(want)
        drift = core_features.feature_change(prev, now).summary()["mean_drift"]
        assert row["drift_from_previous"] == pytest.approx(drift)
        prev = now
    assert rows[-1]["mean_drift"] > 0  # (the run moved its features)
    same = report["runs"][str(base)]
    assert same["trajectory"][0]["mean_drift"] == 0 and same["trajectory"][0]["changed"] == 0
    assert same["wins"] == 0 and same["accuracy"]["tuned"] == same["accuracy"]["base"]
    saved = json.loads((tmp_path / "f" / "features.json").read_text())
    assert saved["layer"] == 1 and (tmp_path / "f" / "features.png").is_file()


def test_a_path_without_weights_is_refused(tmp_path):
    with pytest.raises(ValueError, match="neither a run with checkpoints nor a model folder"):
        ft.run_points(tmp_path)


def test_the_mediators_come_from_the_wins_and_are_what_gets_steered(tuned_run, monkeypatch):
    from rlpost.core.features import mediators, steer, train_sae

    base, run = tuned_run
    st = ft.Study(base, ["arithmetic"], 1, 6)
    final = checkpoint_steps(run)[-1][1] / "model.safetensors"
    calls = []

    def scripted(model, tok, task, examples):  # the tuned model wins on examples 0 and 2
        tuned = torch.equal(model.lm_head.weight, tuned_lm_head)
        calls.append((tuned, ft.activations(model, tok, [examples[0].prompt], 1)[0]))
        return [1.0, 0.0, 1.0, 0.0, 0.0, 0.0] if tuned else [0.0] * 6

    st.load(final)
    tuned_lm_head = st.model.lm_head.weight.detach().clone()
    monkeypatch.setattr("rlpost.llm.model.tiny.greedy_scores", scripted)
    base_acts, tuned_acts = st.acts(None), st.acts(final)
    sae, _ = train_sae(torch.cat([base_acts, tuned_acts]), 32, 4, steps=30)
    codes, tuned_codes = sae.encode(base_acts), sae.encode(tuned_acts)
    base_scores = st.scores(None)
    calls.clear()
    out = ft.interventions(st, sae, codes, final, base_scores, top=3, gamma=2.0, seed=0)
    rows = (st.owner == 0) | (st.owner == 2)
    med = mediators(codes[rows], tuned_codes[rows], 3)
    assert out["wins"] == 2 and out["mediators"] == med.tolist()
    assert out["accuracy"]["tuned"] == [pytest.approx(2 / 6)]
    assert out["accuracy"]["base"] == [0.0]
    # the calls: tuned, tuned with the mediators off, tuned with random ones off, base x2
    assert [t for t, _ in calls] == [True, True, True, False]
    st.load(final)
    plain = ft.activations(st.model, st.tok, [st.sets[0][2][0].prompt], 1)[0]
    assert torch.allclose(calls[1][1], steer(plain, sae, med, 0.0), atol=1e-5)
    assert not torch.allclose(calls[2][1], calls[1][1])  # (a different set of features)
    st.load(None)
    plain = ft.activations(st.model, st.tok, [st.sets[0][2][0].prompt], 1)[0]
    assert torch.allclose(calls[3][1], steer(plain, sae, med, 2.0), atol=1e-5)


def test_both_study_tools_run_from_the_cli_and_refuse_a_non_run_in_one_line(
    tuned_run, tmp_path, capsys
):
    from rlpost.apps.llm.cli import main

    base, run = map(str, tuned_run)
    vg = ["value-gradient", base, run, "--prompts", "2", "--samples", "3"]
    assert main([*vg, "--out", str(tmp_path / "vg")]) == 0
    out = capsys.readouterr().out
    assert "criterion" in out and "run@2" in out
    fe = ["features", run, "--base", base, "--size", "4", "--features", "32", "--k", "4"]
    assert main([*fe, "--sae-steps", "10", "--out", str(tmp_path / "fe")]) == 0
    assert "changed" in capsys.readouterr().out
    assert (tmp_path / "fe" / "features.json").is_file()
    assert main(["features", str(tmp_path), "--base", base]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither a run with checkpoints nor a model folder" in err[0]
    assert main(["features", run, "--base", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a model folder" in err[0]
