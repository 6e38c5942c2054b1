"""The lean rollout engine returns the distribution the model defines: greedy completions
equal ``generate``'s, sampled-token log-probs equal the trainer's recomputation, the
sampler's frequencies match the model's probabilities, and the warpers equal
transformers' own."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rlpost.core.guard import NonFiniteError
from rlpost.llm.model import tiny
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.rollout.engines import (
    HFEngine,
    LeanEngine,
    RolloutEngine,
    SamplingParams,
    lean_unsupported,
    make_local_engine,
)
from rlpost.llm.rollout.engines.lean import process_logits, sample


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


def _small(tok, cls, cfg_cls, **extra):
    kw = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    kw.update(extra)
    torch.manual_seed(0)
    return cls(cfg_cls(**kw)).eval()


@pytest.fixture(scope="module")
def models(tok):
    torch.manual_seed(0)
    return {
        "qwen2": Qwen2ForCausalLM(tiny.tiny_config(tok)).eval(),
        "llama": _small(tok, LlamaForCausalLM, LlamaConfig),
        "qwen3": _small(tok, Qwen3ForCausalLM, Qwen3Config, head_dim=16),
        "mistral": _small(tok, MistralForCausalLM, MistralConfig, sliding_window=None),
    }


def ids(tok, s):
    return tok(s, add_special_tokens=False).input_ids


PROMPTS = ["7+5=", "123+456=", "9=", "40+2="]


def test_lean_engine_satisfies_the_protocol(models, tok):
    assert isinstance(LeanEngine(models["qwen2"], tok), RolloutEngine)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_greedy_completions_equal_generate(models, tok, arch, decode):
    """Prompts of different lengths in one batch (left padding, shared prefill, rows that
    stop at different steps and leave the batch, or with ``decode="static"`` stay in it at
    fixed shapes, as a CUDA graph replays the step): token for token what ``generate``
    gives, with the same finish reasons and (greedy) log-probs."""
    m = models[arch]
    prompts = [ids(tok, p) for p in PROMPTS]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    a = HFEngine(m, tok).generate(prompts, 1, greedy)
    b = LeanEngine(m, tok, decode=decode).generate(prompts, 1, greedy)
    assert b.completion_ids.tolist() == a.completion_ids.tolist()
    assert b.mask.tolist() == a.mask.tolist() and b.finish_reasons == a.finish_reasons
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_greedy_equals_generate_when_rows_stop_early(tok, decode):
    """A model that emits EOS early on some prompts: the compacted batch (finished rows
    removed), or the fixed-shape one that keeps decoding them, still continues the others
    exactly."""
    torch.manual_seed(3)
    m = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    with torch.no_grad():  # bias the head towards EOS so that rows stop at different steps
        m.lm_head.weight[tok.eos_token_id] += 2.0 * m.lm_head.weight[ids(tok, "1")[0]]
    prompts = [ids(tok, p) for p in ["1+1=", "11+2=", "2+2=", "99+1=", "1=", "321+1="]]
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    a = HFEngine(m, tok).generate(prompts, 1, greedy)
    b = LeanEngine(m, tok, decode=decode).generate(prompts, 1, greedy)
    assert len(set(a.lengths.tolist())) > 2  # rows really stop at different steps
    assert b.completion_ids.tolist() == a.completion_ids.tolist()
    assert b.finish_reasons == a.finish_reasons
    stop = SamplingParams(max_new_tokens=16, temperature=0.0, stop=("2", "5"))
    a, b = (
        HFEngine(m, tok).generate(prompts, 1, stop),
        LeanEngine(m, tok, decode=decode).generate(prompts, 1, stop),
    )
    assert b.completion_ids.tolist() == a.completion_ids.tolist()
    assert b.finish_reasons == a.finish_reasons


def test_min_new_tokens_masks_eos_as_generate_does(tok):
    """``min_new_tokens``: EOS is masked out of the sampler until then, as ``generate``'s
    own processor does (before the warpers): the same greedy tokens, log-probs and finish
    reasons on a model that would stop early, no row shorter than the minimum, and at the
    maximum every row runs to full length with no EOS in it."""
    torch.manual_seed(3)
    m = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    with torch.no_grad():  # bias the head towards EOS so that rows would stop early
        m.lm_head.weight[tok.eos_token_id] += 2.0 * m.lm_head.weight[ids(tok, "1")[0]]
    prompts = [ids(tok, p) for p in ["1+1=", "11+2=", "2+2=", "99+1=", "1=", "321+1="]]
    natural = LeanEngine(m, tok).generate(prompts, 1, SamplingParams(16, 0.0))
    assert int(natural.lengths.min()) < 6  # without the minimum some rows stop early
    for low in (6, 16):
        sp = SamplingParams(16, 0.0, min_new_tokens=low)
        a, b = (
            HFEngine(m, tok).generate(prompts, 1, sp),
            LeanEngine(m, tok).generate(prompts, 1, sp),
        )
        assert b.completion_ids.tolist() == a.completion_ids.tolist()
        assert b.finish_reasons == a.finish_reasons and int(b.lengths.min()) >= low
        torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    full = LeanEngine(m, tok).generate(prompts, 4, SamplingParams(16, 1.0, min_new_tokens=16))
    assert full.lengths.tolist() == [16] * 24 and set(full.finish_reasons) == {"length"}
    assert not (full.completion_ids == tok.eos_token_id).any()
    with pytest.raises(ValueError, match="min_new_tokens must be in"):
        SamplingParams(8, 1.0, min_new_tokens=9)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_sampled_logprobs_equal_trainer_recomputation(models, tok, arch, temperature, decode):
    m = models[arch]
    torch.manual_seed(1)
    b = LeanEngine(m, tok, decode=decode).generate(
        [ids(tok, "12+3="), ids(tok, "456+78=")], 4, SamplingParams(10, temperature)
    )
    assert b.completion_ids.shape[0] == 8 and b.group.tolist() == [0] * 4 + [1] * 4
    with torch.no_grad():
        lp, _ = completion_logprobs(
            m, make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id), temperature
        )
    torch.testing.assert_close(lp * b.mask, b.logprobs, atol=1e-5, rtol=1e-5)
    assert (b.logprobs[b.mask == 0] == 0).all()


def test_first_token_frequencies_match_the_model(models, tok):
    """4000 samples of one prompt's first token: total variation from the model's
    next-token distribution well within sampling noise (~0.02 here)."""
    m = models["qwen2"]
    p = ids(tok, "12+34=")
    with torch.no_grad():
        probs = m(input_ids=torch.tensor([p])).logits[0, -1].softmax(-1)
    torch.manual_seed(2)
    b = LeanEngine(m, tok, batch_size=4000).generate([p], 4000, SamplingParams(1, 1.0))
    freq = torch.bincount(b.completion_ids[:, 0], minlength=len(probs)).float() / 4000
    assert 0.5 * (freq - probs).abs().sum() < 0.04


def test_sampler_is_an_exact_categorical_draw():
    """The exponential race: chi-square of 20000 draws against softmax(scores), with
    masked (-inf) entries never drawn."""
    torch.manual_seed(3)
    scores = torch.tensor([[0.3, -1.0, 2.0, -torch.inf, 0.0]]).repeat(20000, 1)
    tok, lp = sample(scores, greedy=False)
    p = scores[0].softmax(-1)
    counts = torch.bincount(tok, minlength=5).float()
    assert counts[3] == 0
    keep = p > 0
    chi2 = float((((counts - 20000 * p) ** 2)[keep] / (20000 * p[keep])).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001
    torch.testing.assert_close(lp, p.log()[tok])


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=5, top_p=0.6),
    ],
)
def test_warpers_equal_transformers(sp):
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(4)
    logits = torch.randn(6, 22) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(sp.temperature)])
    if sp.top_k:
        warpers.append(TopKLogitsWarper(sp.top_k))
    if sp.top_p < 1:
        warpers.append(TopPLogitsWarper(sp.top_p))
    want = warpers(torch.zeros(6, 1, dtype=torch.long), logits.clone())
    got = process_logits(logits, sp)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin], want[fin])


def test_stop_strings_cut_after_the_stop(models, tok):
    m = models["qwen2"]
    torch.manual_seed(6)
    b = LeanEngine(m, tok).generate([ids(tok, "1+1")], 8, SamplingParams(8, 1.0, stop=("+",)))
    assert any(r == "stop" for r in b.finish_reasons)
    for i in range(len(b)):
        text = tok.decode(b.completion_ids[i, : int(b.lengths[i])].tolist())
        assert "+" not in text[:-1]
        assert (b.finish_reasons[i] == "stop") == (
            text.endswith("+") or text.endswith(tok.eos_token)
        )


def test_non_finite_weights_raise(models, tok):
    m = copy.deepcopy(models["qwen2"])
    with torch.no_grad():
        m.model.norm.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="not finite"):
        LeanEngine(m, tok).generate([ids(tok, "1+1=")], 2, SamplingParams(4, 1.0))


def test_lora_policy_greedy_equals_generate(models, tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(7)
    pm = get_peft_model(
        copy.deepcopy(models["qwen2"]),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    prompts = [ids(tok, p) for p in PROMPTS]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    a = HFEngine(pm, tok).generate(prompts, 1, greedy)
    b = LeanEngine(pm, tok).generate(prompts, 1, greedy)
    assert b.completion_ids.tolist() == a.completion_ids.tolist()
    assert pm.base_model.model.config._attn_implementation == "sdpa"  # restored


def test_unsupported_architectures_fall_back_to_generate(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    m = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=32)
    )
    why = lean_unsupported(m)
    assert why is not None and "gpt2" in why
    with pytest.raises(ValueError, match="hf engine"):
        LeanEngine(m, tok)
    assert isinstance(make_local_engine("auto", m, tok), HFEngine)
    sliding = _small(
        tok,
        MistralForCausalLM,
        MistralConfig,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention"],
    )
    assert "sliding" in (lean_unsupported(sliding) or "")


def test_trainer_picks_the_engine_and_says_when_it_falls_back(tok, fast_cfg, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlpost.llm.trainer import Trainer

    def score(completion, example):
        return 0.0

    tr = Trainer(fast_cfg(), reward_fn=score)
    assert isinstance(tr.engine, LeanEngine)  # the tiny Qwen2 default
    assert tr.engine.decode == "auto"
    tr.close()
    static = Trainer(fast_cfg("run.dir=" + str(tr.run_dir) + "-static", "rollout.lean_decode=static"),
                     reward_fn=score)  # fmt: skip
    assert static.engine.decode == "static"  # the config reaches the engine
    static.train()
    static.close()
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    )
    cfg = fast_cfg("run.dir=" + str(tr.run_dir) + "-gpt2")
    tr = Trainer(cfg, model=gpt2, tokenizer=tok, reward_fn=score)
    assert isinstance(tr.engine, HFEngine)
    assert "lean engine does not run this model" in capsys.readouterr().err
    tr.train()  # and it trains through generate
    tr.close()


def test_decode_modes_are_checked(models, tok):
    """An unknown ``decode`` and CUDA graphs without CUDA are refused by name; ``auto`` on
    the CPU is the dynamic loop (no fixed-shape step is built)."""
    m = models["qwen2"]
    with pytest.raises(ValueError, match="decode must be one of"):
        LeanEngine(m, tok, decode="graphs")
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        LeanEngine(m, tok, decode="graph")
    assert LeanEngine(m, tok)._static(None, None, torch.zeros(2, 3, dtype=torch.bool)) is None


def test_a_step_that_cannot_be_captured_decodes_without_the_graph(models, tok, monkeypatch):
    """When the CUDA graph capture fails, the engine says so once and decodes the same
    fixed-shape step eagerly: the same tokens as ``decode="static"``."""
    from rlpost.llm.rollout.engines import lean

    m, prompts = models["qwen2"], [ids(tok, p) for p in PROMPTS]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    want = LeanEngine(m, tok, decode="static").generate(prompts, 1, greedy)

    def refuse(self):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(lean._StaticDecode, "_capture", refuse)
    eng = LeanEngine(m, tok, decode="static")
    monkeypatch.setattr(eng, "_static", lambda fused, st, keys: lean._StaticDecode(
        eng, fused, st, keys, graph=True))  # fmt: skip
    with pytest.warns(UserWarning, match="could not be captured as a CUDA graph") as rec:
        got = eng.generate(prompts, 1, greedy)
    assert len(rec) == 1 and got.completion_ids.tolist() == want.completion_ids.tolist()
