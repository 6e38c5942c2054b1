"""On-policy distillation in the LLM trainer: teachers, routing (MOPD), privileged-context
self-teachers and their row filters (OPSD), the estimators through a real model, and the
multi-domain prompt mixture they route by."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
import torch

from rlpost.core.distill import DISTILL_ESTIMATORS
from rlpost.llm.config import ConfigError
from rlpost.llm.data.prompts import DomainScore, MixtureSource
from rlpost.llm.data.tasks import Example
from rlpost.llm.methods.distill import Teacher, Teachers, teacher_prompt
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch, sampled_index
from rlpost.llm.trainer import Trainer

from .test_provides import spy_entry

MIX = "data.mixture=[{task: arithmetic}, {task: countdown}]"


def _rows(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _random_model(seed: int, tok):
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()


# ------------------------------------------------------------------------------ config


def test_distillation_presets_need_a_teacher_and_teachers_need_such_a_preset(fast_cfg):
    with pytest.raises(ConfigError, match=r"needs teacher_logprobs \(set distill.teachers"):
        fast_cfg("algo.preset=opd")
    with pytest.raises(ConfigError, match="nothing in preset 'grpo' reads a teacher"):
        fast_cfg("distill.teachers=[{path: tiny-random}]")
    with pytest.raises(ConfigError, match=r"domains: \['countdown'\] not among the data"):
        fast_cfg("algo.preset=mopd", "distill.teachers=[{path: self, domains: [countdown]}]")
    cfg = fast_cfg("algo.preset=mopd", MIX, "distill.teachers=[{path: self, domains: [countdown]}]")
    assert cfg.preset().distill.name == "topk"
    cfg = fast_cfg("algo.preset=opd", "distill.teachers=[{path: self}]", "algo.distill.name=full")
    assert cfg.preset().distill.name == "full"


def test_teacher_prompt_fills_the_template_for_text_and_chat():
    e = Example("12+3=", "15", {"a": 12})
    assert teacher_prompt(None, e) == "12+3="
    assert teacher_prompt("{answer}>{prompt}", e) == "15>12+3="
    chat = Example([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "7")
    out = teacher_prompt("hint {answer}: {prompt}", chat)
    assert out[-1] == {"role": "user", "content": "hint 7: q"} and chat.prompt[-1]["content"] == "q"
    with pytest.raises(ValueError, match="fields: a, answer, prompt"):
        teacher_prompt("{missing}", e)


# ----------------------------------------------------------------------------- mixture


def test_mixture_source_tags_domains_scores_each_and_resumes(fast_cfg):
    cfg = fast_cfg(MIX.replace("{task: countdown}", "{task: countdown, weight: 3}"))
    src = MixtureSource(list(cfg.data.mixture), 8, 0)
    batch = src.next_batch(400)
    share = sum(e.meta["domain"] == "countdown" for e in batch) / len(batch)
    assert 0.68 < share < 0.82  # weight 3 of 4
    assert set(src.eval_sets) == {"arithmetic", "countdown"}
    score = DomainScore(src.tasks)
    for e in batch[:20]:
        assert score(e.answer, e) == 1.0  # each example's own verifier accepts its answer
    # a domain without reward (a CoPD expert's peers') scores 0 in training, its held-out
    # examples are still verified
    silent = DomainScore(src.tasks, frozenset({"countdown"}))
    cd = next(e for e in batch if e.meta["domain"] == "countdown")
    assert silent(cd.answer, cd) == 0.0
    held = src.eval_sets["countdown"][0]
    assert silent(held.answer, held) == 1.0
    state = json.loads(json.dumps(src.state_dict()))
    after = src.next_batch(10)
    fresh = MixtureSource(list(cfg.data.mixture), 8, 0)
    fresh.load_state_dict(state)
    assert fresh.next_batch(10) == after


# ------------------------------------------------------------------------- teachers


def test_routing_scores_each_row_with_its_domains_teacher():
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    a, c = _random_model(1, tok), _random_model(2, tok)
    teachers = Teachers(
        [Teacher(a, ["arithmetic"], name="a"), Teacher(c, ["countdown"], name="c")], tok
    )
    rng = random.Random(0)
    exs = [
        Example("1+2=", "3", {"domain": rng.choice(["arithmetic", "countdown", "other"])})
        for _ in range(12)
    ]
    exs[0].meta["domain"], exs[1].meta["domain"] = "arithmetic", "countdown"
    g = torch.Generator().manual_seed(0)
    comp = torch.randint(3, 12, (12, 5), generator=g)
    mask = torch.ones(12, 5)
    mask[3, 2:] = 0
    from rlpost.llm.rollout.engines.base import RolloutBatch

    prompts = [tok.encode(e.prompt) for e in exs]
    batch = RolloutBatch(
        prompts, comp, torch.zeros(12, 5), mask, ["stop"] * 12, torch.arange(12), tok.pad_token_id
    )
    out = teachers.score(
        batch, exs, policy=None, temperature=1.0, topk=3, full=False, micro_batch=5,
        pack=True, layout="ragged",
    )  # fmt: skip
    want = torch.tensor([{"arithmetic": 0, "countdown": 1}.get(e.meta["domain"], -1) for e in exs])
    assert torch.equal(out.which, want) and torch.equal(out.rows, (want >= 0).float())
    sb = make_seq_batch(prompts, comp, mask, tok.pad_token_id)
    for i, model in ((0, a), (1, c)):
        ref_logp, _, (ids, lp) = completion_logprobs(model, sb, 1.0, dists=3)
        rows = want == i
        torch.testing.assert_close(out.logp[rows], (ref_logp * mask)[rows], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            out.topk[1][rows], (lp * mask[..., None])[rows], atol=1e-5, rtol=0
        )
        live = mask[rows] > 0
        assert torch.equal(out.topk[0][rows][live], ids[rows][live])
    assert (out.logp[want < 0] == 0).all()


def test_student_log_probs_of_given_ids_are_differentiable_and_exact():
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    model = _random_model(3, tok)
    g = torch.Generator().manual_seed(1)
    comp = torch.randint(3, 12, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    prompts = [tok.encode("12+3="), tok.encode("12+3="), tok.encode("9-1="), tok.encode("9-1=")]
    V = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, V, (4, 6, 3), generator=g)
    for pack in (False, True):
        for impl in ("fused", "logits"):
            sb = make_seq_batch(prompts, comp, mask, tok.pad_token_id, pack=pack)
            res = completion_logprobs(model, sb, 0.7, impl=impl, student_ids=ids, chunk_size=5)
            full = completion_logprobs(
                model, sb, 0.7, impl="logits", dists=torch.arange(V).expand(4, 6, V)
            )
            torch.testing.assert_close(res[-1], full[2][1].gather(-1, ids), atol=1e-5, rtol=0)
            assert res[-1].requires_grad
            (g_ids,) = torch.autograd.grad(res[-1].sum(), model.lm_head.weight)
            assert g_ids.abs().sum() > 0


def test_sampled_index_marks_absent_tokens():
    ids = torch.tensor([[[3, 5], [1, 2]]])
    assert sampled_index(ids, torch.tensor([[5, 7]])).tolist() == [[1, -1]]


# -------------------------------------------------------------------------- training


def test_a_student_equal_to_its_teacher_has_zero_distillation_and_no_update(fast_cfg):
    """path: self without a privileged prompt is the student itself: the reverse KL and its
    gradient vanish for every estimator, so pure OPD changes no weight."""
    for est in ("topk", "sampled", "full"):
        cfg = fast_cfg(
            "algo.preset=opd", "distill.teachers=[{path: self}]", f"algo.distill.name={est}",
            "optim.weight_decay=0.0",
        )  # fmt: skip
        tr = Trainer(cfg)
        before = {k: v.clone() for k, v in tr.model.state_dict().items()}
        m = tr.update(tr.collect())
        assert abs(m["distill/kl"]) < 1e-5, (est, m["distill/kl"])
        assert m["grad_norm"] < 1e-4, (est, m["grad_norm"])
        drift = max((v - before[k]).abs().max().item() for k, v in tr.model.state_dict().items())
        assert drift < 1e-6, (est, drift)
        tr.close()


def test_opd_pulls_the_student_toward_a_different_teacher(fast_cfg, tmp_path):
    """On the same rollouts, repeated OPD updates lower the (exact) reverse KL from the
    untrained student to the pretrained tiny base."""
    cfg = fast_cfg(
        "algo.preset=opd", "distill.teachers=[{path: tiny}]", "algo.distill.name=full",
        "optim.lr=3e-3", "optim.weight_decay=0.0",
    )  # fmt: skip
    tr = Trainer(cfg)
    col = tr.collect()
    kls = [tr.update(col)["distill/kl"] for _ in range(8)]
    assert kls[0] > 0.5 and kls[-1] < 0.7 * kls[0], kls
    tr.close()


def test_opsd_row_filters_distil_only_correct_or_incorrect_responses(fast_cfg, monkeypatch):
    seen: list = []
    spy_entry(monkeypatch, DISTILL_ESTIMATORS, "topk", seen)
    for rows in ("correct", "incorrect"):
        seen.clear()
        cfg = fast_cfg(
            "algo.preset=opsd", "distill.teachers=[{path: self, template: '{answer}>{prompt}'}]",
            f"algo.distill_rows={rows}", "train.overlong_mask=false",
        )  # fmt: skip
        tr = Trainer(cfg)
        col = tr.collect()
        n = len(col.batch)
        correct = (torch.arange(n) % 3 == 0).float()  # the verifier's outcome per response
        tr.update(dataclasses.replace(col, accuracy=correct))
        got = (seen[0].mask.sum(1) > 0).float()
        live = (col.batch.mask.sum(1) > 0).float()
        assert torch.equal(got, (correct if rows == "correct" else 1 - correct) * live)
        tr.close()


def test_mopd_trains_from_the_cli_and_logs_each_domain(fast_overrides, tmp_path):
    from rlpost.apps.llm.cli import main as cli

    overrides = [
        *fast_overrides, "algo.preset=mopd", MIX, "run.eval_every=2", f"run.dir={tmp_path}",
        "distill.teachers=[{path: tiny-random, domains: [arithmetic]}, "
        "{path: self, domains: [countdown], template: '{answer}>{prompt}'}]",
    ]  # fmt: skip
    assert cli(["train", "--config", "grpo_arithmetic", *overrides]) == 0
    last = _rows(tmp_path)[-1]
    assert {"eval/arithmetic/accuracy", "eval/countdown/accuracy", "distill/kl"} <= set(last)
    assert math.isfinite(last["grad_norm"]) and last["distill/tokens"] > 0


def test_atod_weights_follow_the_schedule_in_training(fast_cfg):
    cfg = fast_cfg("algo.preset=atod", "distill.teachers=[{path: tiny-random}]", "train.steps=3")
    tr = Trainer(cfg)
    ws = []
    for _ in range(3):
        m = tr.update(tr.collect())
        tr.step += 1
        ws.append((m["distill/weight"], m["distill/rl_weight"]))
    assert ws[0] == (1.0, 0.0) and ws[-1] == pytest.approx((0.0, 1.0))
    assert dataclasses.is_dataclass(cfg.preset().distill_schedule)
    tr.close()


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A finished rlpost run (one GRPO step, checkpointed) to serve as the teacher."""
    from rlpost.llm.config import load_config

    from .conftest import FAST

    run = tmp_path_factory.mktemp("teacher") / "run"
    cfg = load_config(None, [*FAST, "train.steps=1", "run.save_every=1", f"run.dir={run}"])
    Trainer(cfg).train()
    return run


@pytest.mark.parametrize(
    "recipe", ["opd_arithmetic", "mopd_mixture", "atod_arithmetic", "opsd_arithmetic"]
)
def test_distillation_recipes_train_a_step(recipe, teacher_run, fast_overrides, tmp_path):
    """Each recipe with its teachers' run directories replaced by a real finished run (a
    run directory stands for its newest checkpoint)."""
    import yaml

    from rlpost.llm.config import load_config
    from rlpost.llm.recipes import recipe_path

    raw = yaml.safe_load(recipe_path(recipe).read_text())
    teachers = [
        {**t, "path": str(teacher_run)} if t["path"] != "self" else t
        for t in raw["distill"]["teachers"]
    ]
    cfg = load_config(
        recipe_path(recipe),
        [*fast_overrides, f"run.dir={tmp_path}", f"distill.teachers={json.dumps(teachers)}"],
    )
    tr = Trainer(cfg)
    m = tr.update(tr.collect())
    assert math.isfinite(m["grad_norm"]) and math.isfinite(m["distill/kl"]) and tr.version == 1
    tr.close()


def test_a_teacher_run_without_a_checkpoint_is_refused(fast_cfg, tmp_path):
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    cfg = fast_cfg("algo.preset=opd", f"distill.teachers=[{{path: {tmp_path / 'empty'}}}]")
    with pytest.raises(ValueError, match="has no finished checkpoint yet"):
        Trainer(cfg)


# ------------------------------------------------------------------ cross-tokenizer


@pytest.fixture(scope="module")
def bpe_teacher(tmp_path_factory):
    """A random tiny Llama (another architecture too) with a BPE tokenizer trained on task
    text, saved as a folder. (transformers 5 loads a folder whose config is qwen2 with
    Qwen2's own tokenizer class, which drops a custom BPE's merges; Llama's keeps them.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from .test_tokalign import _texts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(_texts(300) * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    cfg = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp("bpe") / "teacher"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def _batch_of(tok, texts_and_completions):
    from rlpost.llm.rollout.engines.base import RolloutBatch

    rows = []
    for prompt, comp in texts_and_completions:
        ids = [*tok.encode(comp), tok.eos_token_id]
        rows.append((tok.encode(prompt), ids, [0.0] * len(ids), "stop"))
    return RolloutBatch.from_rows(rows, len(rows), 1, tok.pad_token_id)


def test_a_teacher_of_the_same_tokenizer_through_the_text_path_changes_nothing():
    """Forcing the retokenise-and-align path with the student's own tokenizer gives one
    character per block and exactly the direct path's log-probs."""
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    model = _random_model(7, tok)
    pairs = [("12+30=", "42"), ("7+5=", "12"), ("3 4 5>", "3*4-5")]
    batch = _batch_of(tok, pairs)
    exs = [Example(p, c) for p, c in pairs]
    kw = {"temperature": 1.0, "topk": None, "full": False, "micro_batch": 8,
          "pack": False, "layout": "ragged"}  # fmt: skip
    direct = Teachers([Teacher(model)], tok).score(batch, exs, None, **kw)
    text = Teachers([Teacher(model, tokenizer=tok)], tok).score(batch, exs, None, **kw)
    torch.testing.assert_close(text.logp, direct.logp, atol=1e-5, rtol=0)
    L = batch.mask.shape[1]
    assert torch.equal(
        text.spans * batch.mask.long(), torch.arange(L).expand_as(text.spans) * batch.mask.long()
    )


class _ScorerLikeVLLM:
    """The :class:`~rlpost.llm.rollout.engines.vllm.VLLMScorer` interface answered from a plain
    forward over prompt + completion, read the way vLLM's ``prompt_logprobs`` are: each
    position's log-probs of the next token, a dict of the top-K plus the actual token."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def score(self, prompts, completions, topk):
        out = []
        for p, c in zip(prompts, completions, strict=True):
            logits = self.model(torch.tensor([p + c])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[len(p) - 1 : len(p) + len(c) - 1]
            lps = [float(lp[j, t]) for j, t in enumerate(c)]
            tops = []
            if topk:
                for j, t in enumerate(c):
                    d = {int(i): float(lp[j, i]) for i in lp[j].topk(topk).indices}
                    d[int(t)] = float(lp[j, t])  # vLLM adds the actual token
                    best = sorted(d.items(), key=lambda kv: -kv[1])[:topk]
                    tops.append(best)
            out.append((lps, tops))
        return out


def test_a_vllm_teacher_fills_the_same_scores_as_the_in_process_teacher():
    """The vLLM teacher's plumbing (its log-probs and top-K placed on the student's rows)
    on CPU: a scorer answering like vLLM's prompt log-probs gives exactly the in-process
    teacher's scores; the full vocabulary is refused with the fix."""
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    model = _random_model(11, tok)
    pairs = [("12+30=", "42"), ("7+5=", "12"), ("3 4 5>", "3*4-5")]
    batch = _batch_of(tok, pairs)
    exs = [Example(p, c) for p, c in pairs]
    kw = {"temperature": 1.0, "topk": 4, "full": False, "micro_batch": 2,
          "pack": False, "layout": "ragged"}  # fmt: skip
    direct = Teachers([Teacher(model)], tok).score(batch, exs, None, **kw)
    via = Teachers([Teacher(None, scorer=_ScorerLikeVLLM(model))], tok).score(
        batch, exs, None, **kw
    )
    torch.testing.assert_close(via.logp, direct.logp, atol=1e-5, rtol=0)
    m = batch.mask.bool()
    assert torch.equal(via.topk[0][m], direct.topk[0][m])
    torch.testing.assert_close(via.topk[1][m], direct.topk[1][m], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="not the whole vocabulary"):
        Teachers([Teacher(None, scorer=_ScorerLikeVLLM(model))], tok).score(
            batch, exs, None, **{**kw, "topk": None, "full": True}
        )


def test_a_bpe_teacher_scores_aligned_text_blocks(bpe_teacher):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.llm.model import tiny
    from rlpost.llm.model.tokalign import align, tokenize

    tok = tiny.build_tokenizer()
    tt = AutoTokenizer.from_pretrained(bpe_teacher)
    tm = AutoModelForCausalLM.from_pretrained(bpe_teacher).eval()
    pairs = [("12+30=", "42"), ("36+47=", "83"), ("3 4 5>", "3*4-5")]
    batch = _batch_of(tok, pairs)
    exs = [Example(p, c) for p, c in pairs]
    out = Teachers([Teacher(tm, tokenizer=tt)], tok).score(
        batch, exs, None, temperature=1.0, topk=None, full=False, micro_batch=8,
        pack=False, layout="ragged",
    )  # fmt: skip
    merged = 0
    for r, (prompt, comp) in enumerate(pairs):
        b = tokenize(tt, comp)
        ids = torch.tensor([[*b.ids, tt.eos_token_id]])
        sb = make_seq_batch(
            [tt.encode(prompt)], ids, torch.ones_like(ids, dtype=torch.float), tt.pad_token_id
        )
        ref = completion_logprobs(tm, sb, 1.0)[0][0]
        al = align(tokenize(tok, comp), b)
        n = len(comp)
        for k, ((a0, a1), (b0, b1)) in enumerate(zip(al.a, al.b, strict=True)):
            assert (out.spans[r, a0:a1] == k).all()
            torch.testing.assert_close(
                out.logp[r, a0:a1].sum(), ref[b0:b1].sum(), atol=1e-5, rtol=0
            )
        torch.testing.assert_close(out.logp[r, n], ref[len(b.ids)], atol=1e-5, rtol=0)  # <eos>
        assert out.spans[r, n] == len(al)
        merged += len(al) < len(comp)
    assert merged  # BPE merged some characters: blocks of several student tokens


def test_cross_tokenizer_opd_trains_with_the_sampled_estimator_only(fast_cfg, bpe_teacher):
    teacher = f"distill.teachers=[{{path: {bpe_teacher}}}]"
    with pytest.raises(ValueError, match="sampled estimator only"):
        Trainer(fast_cfg("algo.preset=opd", teacher))
    tr = Trainer(fast_cfg("algo.preset=opd", teacher, "algo.distill.name=sampled",
                          "train.overlong_mask=false"))  # fmt: skip
    m = tr.update(tr.collect())
    assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 and math.isfinite(m["distill/kl"])
    tr.close()


def test_a_missing_local_teacher_folder_fails_fast(fast_cfg, tmp_path):
    cfg = fast_cfg("algo.preset=opd", f"distill.teachers=[{{path: {tmp_path / 'nope'}}}]")
    with pytest.raises(ValueError, match=r"no folder .*train that teacher first"):
        Trainer(cfg)


def test_a_vllm_teacher_is_refused_with_the_fix_where_it_cannot_run(fast_cfg, tmp_path):
    from rlpost.llm.trainer import Trainer

    with pytest.raises(ValueError, match=r"rollout\.temperature=1\.0"):
        Trainer(fast_cfg("algo.preset=opd", "rollout.temperature=0.7",
                         f"distill.teachers=[{{path: {tmp_path}, engine: vllm}}]"))  # fmt: skip
    with pytest.raises(ValueError, match="engine hf only"):
        Trainer(fast_cfg("algo.preset=opsd", "distill.teachers=[{path: self, engine: vllm}]"))
