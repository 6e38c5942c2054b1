"""The variance-aware reward model on the tiny LM (000-28): trained on simulated judges,
it recovers each answer style's mean and spread, scores as a reward function
(``mu - kappa sigma``) and picks best-of-N; the command trains and saves it."""

from __future__ import annotations

import json

import pytest
import torch

from rlpost.core.io.config import ConfigError
from rlpost.llm.model import tiny
from rlpost.llm.preference.variance_rm import (
    JUDGES,
    VarianceReward,
    evaluate_rm,
    heads,
    load_model,
    load_rows,
    synthetic_rows,
    train_variance_rm,
)


def test_the_embedded_judges_disagree_where_their_spread_says():
    rows = synthetic_rows(400, seed=0)
    assert all(0.0 <= r.preference <= 1.0 and len(r.chosen_anchors) == 2 for r in rows)
    plain_vs_junk = [r.preference for r in rows if r.rejected in ("=", "+-", ":", ">>")
                     and " " not in r.chosen and "(" not in r.chosen and r.chosen not in
                     ("=", "+-", ":", ">>")]  # fmt: skip
    assert plain_vs_junk and min(plain_vs_junk) == 1.0  # everyone prefers the answer


def test_a_bad_preference_file_is_named_in_one_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl line 2: KeyError: 'chosen'"):
        load_rows(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_rows(tmp_path / "missing.jsonl")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    model, tok = load_model(tiny.build_base(progress=False))
    train_variance_rm(model, tok, synthetic_rows(1000, seed=0), steps=140, progress=False)
    out = tmp_path_factory.mktemp("rm")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model, tok, out


def test_the_model_recovers_each_styles_mean_and_spread(trained, record_result):
    model, tok, _ = trained
    answers = {"plain": "68", "twice": "68 68", "bracketed": "(68)", "junk": "=+"}
    with torch.no_grad():
        mu, lv = heads(model, tok, ["23+45="] * 4, list(answers.values()))
    sigma = (lv / 2).exp()
    record_result(
        "variance_rm_styles",
        [
            {
                "answer": a,
                "style": k,
                "mu": float(mu[i]),
                "sigma": float(sigma[i]),
                "judges_mu": JUDGES[k][0],
                "judges_sigma": JUDGES[k][1],
            }
            for i, (k, a) in enumerate(answers.items())
        ],
        catalog_ids=["000-28"],
        config={"prompt": "23+45=", "train_steps": 140, "pairs": 1000},
        seeds=[0],
    )
    for i, kind in enumerate(answers):
        true_mu, true_sigma = JUDGES[kind]
        assert abs(float(mu[i]) - true_mu) < 0.4, kind
        assert abs(float(sigma[i]) - true_sigma) < 0.3, kind
    assert int(sigma.argmax()) == 1  # the polarising style has the widest spread
    held = evaluate_rm(model, tok, synthetic_rows(200, seed=1))
    assert held["pair_accuracy"] > 0.9 and held["anchor_abs_error"] < 0.1


def test_as_a_reward_and_for_best_of_n_the_spread_matters(trained):
    _, _, out = trained
    neutral, averse = VarianceReward(out), VarianceReward(out, kappa=1.0)
    example = type("E", (), {"prompt": "23+45="})()
    assert neutral("68", example) > neutral("(68)", example)
    # "68 68" has the higher mean, "(68)" the narrower spread: the risk-averse reward
    # prefers the reliable one
    assert neutral.best_of_n("23+45=", ["68 68", "(68)"]) == 0
    assert averse.best_of_n("23+45=", ["68 68", "(68)"]) == 1
    mu, lv = heads(neutral.model, neutral.tok, ["23+45="], ["68 68"])
    want = float(mu[0] - (lv[0] / 2).exp())
    assert averse("68 68", example) == pytest.approx(want, abs=1e-5)


def test_the_command_trains_and_saves_a_loadable_model(tmp_path, capsys):
    from rlpost.apps.llm.cli import main

    out = tmp_path / "rm"
    assert main(["reward-model", "--steps", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pair accuracy" in text and "saved:" in text
    report = json.loads((out / "reward_model.json").read_text())
    assert report["steps"] == 3 and "pair_accuracy" in report
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(out).config.num_labels == 2
