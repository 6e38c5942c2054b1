"""Dynamic Latent Routing (000-22): codes added once, the search scores every code exactly
as separate forwards would, the selection, the update's loss against an independent
formulation, SFT at zero codes, and exact resume of the trainer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from rlpost.core.io.rundir import locked_here
from rlpost.llm.model.tiny import build_tokenizer, tiny_config
from rlpost.llm.runtimes.dlr import (
    DLRTrainer,
    add_codes,
    load_dlr_config,
    search_codes,
    select_codes,
)

FAST = [
    "model.path=tiny-random", "data.train_size=16", "data.eval_size=8", "train.batch_size=4",
    "train.steps=4", "run.eval_every=0", "run.save_every=2", "run.progress=false",
    "run.tensorboard=false", "run.threads=1", "latent.codes=3",
]  # fmt: skip


def _model():
    torch.manual_seed(0)
    tok = build_tokenizer()
    return Qwen2ForCausalLM(tiny_config(tok)), tok


def test_codes_are_added_once_near_the_token_they_start_from():
    model, tok = _model()
    n = len(tok)
    eq = tok.convert_tokens_to_ids("=")
    ids = add_codes(model, tok, 4, noise=0.05, like=eq)
    assert ids == list(range(n, n + 4)) and len(tok) == n + 4
    w = model.get_input_embeddings().weight
    assert w.shape[0] == n + 4
    gap = (w[ids] - w[eq]).norm(dim=1)
    assert bool((gap > 0).all()) and bool((gap < 0.2 * w[:n].norm(dim=1).mean()).all())
    assert torch.unique(w[ids], dim=0).shape[0] == 4  # distinct: the search can tell them apart
    assert add_codes(model, tok, 4) == ids and len(tok) == n + 4  # idempotent


def _logp_of(model, ids: list[int], start: int) -> float:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return float(sum(lp[t - 1, ids[t]] for t in range(start, len(ids))))


def test_the_search_scores_every_code_as_separate_forwards_would():
    model, tok = _model()
    codes = add_codes(model, tok, 3)
    prompts = [
        tok.encode("12+34", add_special_tokens=False),
        tok.encode("5+6", add_special_tokens=False),
    ]
    answers = [
        [*tok.encode("46", add_special_tokens=False), 1],
        [*tok.encode("11", add_special_tokens=False), 1],
    ]
    lp_y, lp_z = search_codes(model, prompts, answers, codes, pad=0)
    for b, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        with torch.no_grad():
            route = model(torch.tensor([p])).logits[0, -1, codes].log_softmax(-1)
        torch.testing.assert_close(lp_z[b], route, atol=1e-5, rtol=0)
        for k, c in enumerate(codes):
            want = _logp_of(model, [*p, c, *a], len(p) + 1)
            assert abs(float(lp_y[b, k]) - want) < 1e-4


def test_selection_is_the_posterior_mode_or_the_likelihood_mode():
    lp_y = torch.tensor([[-1.0, -1.2, -5.0]])
    lp_z = torch.log(torch.tensor([[0.1, 0.8, 0.1]]))
    assert select_codes(lp_y, lp_z, "posterior").tolist() == [1]
    assert select_codes(lp_y, lp_z, "likelihood").tolist() == [0]


@pytest.mark.parametrize("codes", [0, 3])
def test_the_update_is_the_answer_nll_plus_the_router_cross_entropy(tmp_path, codes):
    cfg = load_dlr_config(None, [*FAST, f"latent.codes={codes}", f"run.dir={tmp_path / 'r'}",
                                 "latent.routing_coef=0.5"])  # fmt: skip
    tr = DLRTrainer(cfg)
    try:
        exs = tr.train_set[:4]
        prompts, answers = tr._encode(exs)
        if codes:  # the search's choice, recomputed, then the loss by hand
            lp_y, lp_z = search_codes(tr.model, prompts, answers, tr.codes, tr.pad)
            z = select_codes(lp_y, lp_z).tolist()
            nll = sum(-float(lp_y[b, z[b]]) for b in range(4)) / sum(map(len, answers))
            ce = -float(lp_z[torch.arange(4), z].mean())
            want = nll + 0.5 * ce
            full = [tr.tok.encode(e.prompt, add_special_tokens=False) for e in exs]
            assert prompts == [f[:-1] for f in full]  # the code stands in the delimiter's place
        else:  # plain SFT: the answer tokens' mean NLL after the whole prompt
            want = sum(
                -_logp_of(tr.model, [*p, *a], len(p)) for p, a in zip(prompts, answers, strict=True)
            ) / sum(map(len, answers))
        got = tr.update(exs)
        assert abs(got["loss"] - want) < 1e-4
    finally:
        tr.logger.close()


def test_a_run_checkpoints_loadable_models_and_resumes_exactly(tmp_path):
    straight = DLRTrainer(load_dlr_config(None, [*FAST, f"run.dir={tmp_path / 'a'}"]))
    straight.train()
    assert not locked_here(tmp_path / "a")  # the run has ended: its directory is released
    half = DLRTrainer(load_dlr_config(None, [*FAST, "train.steps=2", f"run.dir={tmp_path / 'b'}"]))
    half.train()
    cfg = load_dlr_config(None, [*FAST, f"run.dir={tmp_path / 'b'}"])
    resumed = DLRTrainer(cfg, resume=True)
    assert resumed.step == 2
    resumed.train()
    for (n, p), q in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, msg=n)
    ckpt = tmp_path / "a" / "checkpoints" / "step-000004"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.convert_tokens_to_ids("<z2>") == straight.codes[2]
    torch.testing.assert_close(
        model.get_input_embeddings().weight, straight.model.get_input_embeddings().weight
    )


def test_dlr_trains_from_the_cli_and_bad_settings_are_refused(tmp_path, capsys):
    from rlpost.apps.llm.cli import main as cli
    from rlpost.llm.runtimes.dlr import ConfigError

    over = [*FAST, "run.eval_every=2", f"run.dir={tmp_path / 'cli'}"]
    assert cli(["dlr", "--config", "dlr_arithmetic", *over]) == 0
    assert "held-out greedy accuracy" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"latent\.codes"):
        load_dlr_config(None, ["latent.codes=-1"])
    with pytest.raises(ConfigError, match="placement"):
        load_dlr_config(None, ["latent.placement=middle"])
