"""Speculative rollouts (001-27): greedy output is the target's, sampled tokens follow the
target's distribution (not the draft's), and the log-probs are the target's."""

import pytest
import torch
from scipy.stats import chisquare
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlpost.llm.model import tiny
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.rollout.engines import HFEngine, SamplingParams
from rlpost.llm.rollout.engines.speculative import SpeculativeEngine, early_exit_draft


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


def _model(tok, seed: int, init: float = 0.02, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
        tie_word_embeddings=True, initializer_range=init,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def peaked(tok):
    """Target and draft with sharp, different next-token distributions (large weights)."""
    return _model(tok, 0, init=0.3), _model(tok, 1, init=0.3)


def ids(tok, s):
    return tok(s, add_special_tokens=False).input_ids


PROMPTS = ["7+5=", "123+456=", "9=", "40+2="]


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("which", ["early_exit", "other", "self"])
def test_greedy_output_is_the_targets(tok, which, k):
    target = _model(tok, 0, layers=3)
    draft = {"early_exit": 1, "other": _model(tok, 7, layers=1), "self": target}[which]
    prompts = [ids(tok, s) for s in PROMPTS]
    sp = SamplingParams(12, 0.0, stop=("5",))  # rows end at EOS, the stop string or 12
    ref = HFEngine(target, tok).generate(prompts, 1, sp)
    eng = SpeculativeEngine(target, tok, draft, k=k)
    got = eng.generate(prompts, 1, sp)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.mask, ref.mask) and got.finish_reasons == ref.finish_reasons
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=1e-5)
    if which == "self":
        assert eng.acceptance == 1.0  # a draft equal to the target is always accepted


def _exact_marginals(model, prompt: list[int], V: int) -> list[torch.Tensor]:
    """The model's exact marginal distributions of sampled tokens 1, 2 and 3."""
    with torch.no_grad():
        p1 = model(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)
        one = torch.tensor([[*prompt, t] for t in range(V)])
        p2 = model(input_ids=one).logits[:, -1].softmax(-1)  # [V, V]: p(t2 | t1)
        two = torch.tensor([[*prompt, a, b] for a in range(V) for b in range(V)])
        p3 = model(input_ids=two).logits[:, -1].softmax(-1)  # [V*V, V]: p(t3 | t1, t2)
    joint12 = (p1[:, None] * p2).reshape(-1)  # [V*V]
    return [p1, p1 @ p2, joint12 @ p3]


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    counts, probs = counts.double(), probs.double() / probs.double().sum()
    big = probs * counts.sum() >= 5  # cells with an expected count of 5 or more; rest pooled
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([probs[big], probs[~big].sum(0, keepdim=True)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(chisquare(obs.numpy(), (exp / exp.sum() * obs.sum()).numpy()).pvalue)


def test_sampled_tokens_follow_the_target_not_the_draft(tok, peaked):
    """6000 three-token samples with a draft whose distributions differ from the target's
    (token 1 comes from the prefill, tokens 2 and 3 are a round's two drafts, accepted or
    replaced): chi-square against the target's exact marginals of tokens 2 and 3 passes,
    and the same test rejects the draft's own marginals (its power)."""
    target, draft = peaked
    V = target.config.vocab_size
    prompt = ids(tok, "12+34=")
    p = _exact_marginals(target, prompt, V)
    q = _exact_marginals(draft, prompt, V)
    assert 0.5 * float((p[1] - q[1]).abs().sum()) > 0.3  # the draft is a poor proposal
    torch.manual_seed(3)
    eng = SpeculativeEngine(target, tok, draft, k=2, batch_size=6000)
    eng.eos_ids = set()  # rows run past EOS, as the exact marginals do
    b = eng.generate([prompt], 6000, SamplingParams(3, 1.0))
    st = eng.stats
    assert st["accepted"] > 200 and st["proposed"] - st["accepted"] > 200  # both paths ran
    assert int(b.mask.sum()) == 18000
    for t in (1, 2):
        c = torch.bincount(b.completion_ids[:, t], minlength=V).float()
        assert _chi2_pvalue(c, p[t]) > 1e-3, f"token {t + 1}"
        assert _chi2_pvalue(c, q[t]) < 1e-6, f"token {t + 1}: the test has no power"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_the_targets(tok, peaked, temperature):
    target, draft = peaked
    torch.manual_seed(4)
    b = SpeculativeEngine(target, tok, draft, k=3).generate(
        [ids(tok, "12+3="), ids(tok, "456+78=")], 4, SamplingParams(10, temperature)
    )
    with torch.no_grad():
        lp, _ = completion_logprobs(
            target, make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id), temperature
        )
    torch.testing.assert_close(lp * b.mask, b.logprobs, atol=1e-4, rtol=1e-4)


def test_the_early_exit_draft_shares_the_targets_weights(tok):
    target = _model(tok, 0, layers=3)
    draft = early_exit_draft(target, 1)
    assert len(draft.get_decoder().layers) == 1
    assert draft.get_decoder().layers[0] is target.get_decoder().layers[0]
    with torch.no_grad():  # an update of the target is the draft's
        target.get_decoder().layers[0].mlp.up_proj.weight.add_(1.0)
    x = torch.tensor([ids(tok, "1+2=")])
    with torch.no_grad():
        h = target.get_decoder().layers[0].mlp.up_proj.weight
        assert draft.get_decoder().layers[0].mlp.up_proj.weight is h
        draft(input_ids=x)
    with pytest.raises(ValueError, match=r"layers must be in 1\.\.2"):
        early_exit_draft(target, 3)


def parity(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


def test_the_trainer_rolls_out_speculatively(fast_cfg):
    import json
    from pathlib import Path

    from rlpost.llm.trainer import Trainer

    cfg = fast_cfg("rollout.speculative={draft: 2, k: 3}", "rollout.max_new_tokens=6")
    tr = Trainer(cfg, reward_fn=parity)
    assert isinstance(tr.engine, SpeculativeEngine)
    tr.train()
    rows = [json.loads(x) for x in (Path(cfg.run.dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "spec/acceptance" in r]
    assert len(steps) == 2 and all(0 <= r["spec/acceptance"] <= 1 for r in steps)
    assert all(r["mismatch/abs_max"] < 1e-4 for r in steps)  # the target's own log-probs


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout.engine=vllm"], "in-process engines only"),
        (["model.lora={r: 4}"], "early-exit draft needs full weights"),
    ],
)
def test_speculative_config_refusals(overrides, message):
    from rlpost.llm.config import load_config

    with pytest.raises(ValueError, match=message):
        load_config(None, ["rollout.speculative={draft: 1}", *overrides])


@pytest.mark.parametrize("source", ["own_greedy", "garbage"])
def test_given_drafts_keep_the_greedy_output(tok, source):
    """BubbleSpec's drafts (rollouts made earlier) are verified, never trusted: greedy
    output equals generate's whether the drafts are the target's own or garbage."""
    target = _model(tok, 0, layers=3)
    prompts = [ids(tok, s) for s in PROMPTS]
    sp = SamplingParams(12, 0.0)
    ref = HFEngine(target, tok).generate(prompts, 1, sp)
    g = torch.Generator().manual_seed(0)
    drafts = (
        [ref.completion_ids[i, : int(ref.mask[i].sum())].tolist() for i in range(len(prompts))]
        if source == "own_greedy"
        else [torch.randint(0, len(tok), (12,), generator=g).tolist() for _ in prompts]
    )
    eng = SpeculativeEngine(target, tok, None, k=4)
    got = eng.generate_with_drafts(prompts, 1, sp, drafts)
    assert torch.equal(got.completion_ids, ref.completion_ids) and torch.equal(got.mask, ref.mask)
    torch.testing.assert_close(got.logprobs, ref.logprobs, atol=1e-5, rtol=1e-5)
    if source == "own_greedy":
        assert eng.acceptance > 0.5  # (proposals past a row's end are the pad id)
        assert eng.stats["tokens"] / eng.stats["row_rounds"] > 2
    plain = eng.generate(prompts, 1, sp)  # no drafts, no draft model: plain decoding
    assert torch.equal(plain.completion_ids, ref.completion_ids)


def test_given_drafts_keep_the_targets_distribution(tok, peaked):
    """Drafts sampled from another model, verified by the target: the target's exact
    marginals of tokens 2 and 3 pass chi-square, the drafts' own are rejected."""
    target, other = peaked
    V = target.config.vocab_size
    prompt = ids(tok, "12+34=")
    p = _exact_marginals(target, prompt, V)
    q = _exact_marginals(other, prompt, V)
    torch.manual_seed(5)
    gen = HFEngine(other, tok)
    gen.eos_ids = set()
    drafts = gen.generate([prompt], 6000, SamplingParams(3, 1.0)).completion_ids.tolist()
    eng = SpeculativeEngine(target, tok, None, k=3, batch_size=6000)
    eng.eos_ids = set()
    b = eng.generate_with_drafts([prompt], 6000, SamplingParams(3, 1.0), drafts)
    st = eng.stats
    assert st["accepted"] > 200 and st["proposed"] - st["accepted"] > 200
    for t in (1, 2):
        c = torch.bincount(b.completion_ids[:, t], minlength=V).float()
        assert _chi2_pvalue(c, p[t]) > 1e-3, f"token {t + 1}"
        assert _chi2_pvalue(c, q[t]) < 1e-6, f"token {t + 1}: the test has no power"


def test_bubblespec_trains_on_policy_from_pre_generated_drafts(fast_cfg):
    """train.pipeline bubblespec: each step's rollouts verify drafts generated for its
    prompts during the previous update; they stay exactly on-policy (staleness 0, the
    mismatch at float error)."""
    import json
    from pathlib import Path

    from rlpost.llm.trainer import Trainer

    cfg = fast_cfg(
        "train.pipeline=bubblespec", "train.steps=3", "train.draft_k=3", "run.eval_every=3"
    )
    tr = Trainer(cfg, reward_fn=parity)
    assert isinstance(tr.engine, SpeculativeEngine) and tr.engine.draft is None
    seen = []
    orig = tr.rollouts.drafts_for

    def spy(examples):
        out = orig(examples)
        seen.append([e.prompt for e in examples])
        return out

    tr.rollouts.drafts_for = spy
    trained = []
    update = tr.update

    def checked(col):
        trained.append(sorted({e.prompt for e in col.examples}))
        return update(col)

    tr.update = checked
    tr.train()
    rows = [json.loads(x) for x in (Path(cfg.run.dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "accuracy" in r]
    assert [r["staleness"] for r in steps] == [0.0, 0.0, 0.0]
    assert all(r["mismatch/abs_max"] < 1e-4 for r in steps)
    assert len(seen) == 2  # drafts for steps 2 and 3, made during updates 1 and 2
    assert [sorted(set(p)) for p in seen] == trained[1:]  # for the prompts then trained
    assert tr.engine.stats["proposed"] > 0
    assert "eval/accuracy" in rows[-1]  # evaluation decodes plainly on the same engine


def test_bubblespec_refusals():
    from rlpost.llm.config import load_config

    with pytest.raises(ValueError, match="refill rounds"):
        load_config(None, ["train.pipeline=bubblespec", "algo.preset=dapo"])
