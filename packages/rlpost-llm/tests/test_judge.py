"""Rubrics in words (RubricEM, 000-30): a judge model reads criteria written in natural
language. The reading is checked against an independent forward of a judge model that
can spell words; the plumbing into Stage-Structured GRPO with a scripted judge."""

from __future__ import annotations

import pickle

import pytest
import torch

from rlpost.llm.config import ConfigError
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.rollout.judge import WordJudge
from rlpost.llm.trainer import Trainer

from .test_reflect_episodes import ENV, _policy


@pytest.fixture(scope="module")
def judge_path(tmp_path_factory):
    """A seeded random Qwen2 over every byte (so that it reads words), saved as a
    checkpoint: no language model can be downloaded here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    chars = list(tiny._bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate([*tiny.SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = tiny._fast(backend)
    tok.model_max_length = 512
    model = tiny.init_model(Qwen2ForCausalLM, tiny.tiny_config(tok, positions=512), tok, 0)
    path = tmp_path_factory.mktemp("judge")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _independent(path: str, query: str, yes: str, no: str) -> float:
    """``P(yes) / (P(yes) + P(no))`` from two unpadded forwards, one per answer: the log-
    probability of each answer's first token after the query."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    lp = []
    for word in (yes, no):
        ids = tok(query + word, add_special_tokens=False)["input_ids"]
        q = len(tok(query, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lp.append(float(logits[q - 1].log_softmax(-1)[ids[q]]))
    return float(torch.tensor(lp).softmax(0)[0])


def test_the_judge_reads_its_answer_off_the_next_token_distribution(judge_path):
    judge = WordJudge(judge_path, yes="yes", no="no", micro_batch=2)
    queries = ["Is 7 prime? Answer: ", "Does the query name a relation? Answer yes or no: ", "x"]
    got = judge.probabilities(queries)  # padded batches of 2, lengths differ
    want = [_independent(judge_path, q, "yes", "no") for q in queries]
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert not torch.allclose(got, got[0])  # (the seeded model tells the queries apart)


def test_a_rubric_score_is_the_mean_over_its_criteria_as_a_trl_reward(judge_path):
    judge = WordJudge(judge_path, criteria=["It is short."], yes="yes", no="no")
    rubric = [["It is short.", "It names a number."], ["It is polite."]]
    got = judge(prompts=["p1", "p2"], completions=["c1", "c2"], rubric=rubric)
    one = [judge(prompts=[p], completions=[c], rubric=[[k]])[0]
           for p, c, r in zip(["p1", "p2"], ["c1", "c2"], rubric, strict=True) for k in r]  # fmt: skip
    assert got == pytest.approx([(one[0] + one[1]) / 2, one[2]])
    default = judge(prompts=["p1"], completions=["c1"])  # no rubric column: its criteria
    assert default == pytest.approx([one[0]])
    assert len(pickle.dumps(judge)) < 2000  # to a reward worker: the path, not the weights


def test_judge_settings_that_cannot_work_are_refused(judge_path):
    with pytest.raises(ValueError, match=r"missing \{criterion\}"):
        WordJudge(judge_path, template="{task} {response}")
    with pytest.raises(ValueError, match="must start with different tokens"):
        WordJudge(judge_path, yes=" yes", no=" no").probabilities(["q"])  # both "Ġ..."
    with pytest.raises(ValueError, match="row 0 has no criteria"):
        WordJudge(judge_path, yes="yes", no="no")(prompts=["p"], completions=["c"])


def test_stage_scores_come_from_the_criteria_in_words(fast_cfg, monkeypatch):
    """Research turns judged by a scripted reader of the words: a criterion asking for a
    relation is met by a query that names one. The plan and answer stages have no
    criteria, so they keep the environment's own scores."""
    criterion = "The query names the relation it asks about, as in 17*."
    seen = []

    def read(self, queries):
        seen.extend(queries)
        out = []
        for q in queries:
            action = q.split("Response: ")[1].split(" -> ")[0]
            out.append(float(criterion in q and any(r in action for r in "+*-")))
        return torch.tensor(out)

    monkeypatch.setattr(WordJudge, "probabilities", read)
    env = ENV.replace(
        "}, turn_signal",
        f"}}, judge: {{path: none, criteria: {{research: ['{criterion}']}}}}, turn_signal",
    )
    tr = Trainer(fast_cfg("algo.preset=rubricem", env, "rollout.max_new_tokens=5"))
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_policy(tok), pad_id=tok.pad_token_id)
        col = tr.collect()
        stages, scores = col.turn_stages, col.turn_rewards
        for i in range(len(col.examples)):
            actions = tok.decode(col.batch.completion_ids[i]).split("<eos>")
            for u in range(int((stages[i] >= 0).sum())):
                if int(stages[i, u]) == 0:  # research: the words' verdict
                    precise = any(r in actions[u].split(">")[-1] for r in "+*-")
                    assert float(scores[i, u]) == float(precise)
                elif int(stages[i, u]) == 2:  # the plan: the environment's (well-formed)
                    assert float(scores[i, u]) == 1.0
        assert seen and any(" -> " in q for q in seen)  # a turn: its action and observation
    finally:
        tr.close()


@pytest.mark.parametrize(
    ("judge", "signal", "match"),
    [
        ("{path: m, criteria: {research: [x]}}", "env", "needs data.env.turn_signal=rubric"),
        ("{path: m, criteria: {review: [x]}}", "rubric", "unknown stage 'review'"),
        ("{path: m, criteria: {research: []}}", "rubric", "stage 'research' has no criteria"),
    ],
)
def test_word_judge_config_errors_name_the_problem(fast_cfg, judge, signal, match):
    with pytest.raises(ConfigError, match=match):
        fast_cfg(f"data.env={{name: search, judge: {judge}, turn_signal: {signal}}}")
