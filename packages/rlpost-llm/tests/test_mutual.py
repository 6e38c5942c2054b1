"""Mutual RL (catalog 001-11): heterogeneous policies (two tokenizers, two model families)
exchanging experience: the tokenizer heterogeneity layer carries log-probs exactly by text
block, success-gated transfer moves only verified successes onto the rescue set, XGRPO's
peer rows shape the baseline and nothing else, and the policies train together on Ray."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from rlpost.core.peers import BASELINE, OWN, TRAIN
from rlpost.llm.config import ConfigError
from rlpost.llm.data.tasks import make_task
from rlpost.llm.model import tiny
from rlpost.llm.model.tokalign import tokenize
from rlpost.llm.runtimes.mutual import (
    Experience,
    _offsets,
    carry_logprobs,
    export_experience,
    import_experience,
    run_mutual,
)


@pytest.fixture(scope="module")
def bpe_policy(tmp_path_factory):
    """A random micro Llama with the BPE tokenizer of the tiny BPE base, as a folder."""
    from transformers import LlamaForCausalLM

    tok = tiny.build_bpe_tokenizer(make_task("arithmetic", digits=2))
    torch.manual_seed(3)
    folder = tmp_path_factory.mktemp("mutual") / "bpe"
    LlamaForCausalLM(tiny.tiny_config(tok, "micro", "llama")).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _policies(bpe_policy) -> str:
    return f"mutual.policies=[{{name: char, path: tiny-random}}, {{name: bpe, path: {bpe_policy}}}]"


LONG = "rollout.max_new_tokens=6"  # room for a 4-digit answer and its EOS


def _groups(col):
    """The batch's groups, each group's first row, prompt and reference answer."""
    groups = sorted(set(col.batch.group.tolist()))
    first = {g: col.batch.group.tolist().index(g) for g in groups}
    prompts = [col.examples[first[g]].prompt for g in groups]
    return groups, first, prompts, [col.examples[first[g]].answer for g in groups]


def _peer_experience(tok, prompts: list[str], texts: list[list[str]], seed: int = 0) -> Experience:
    """A peer's experience of ``texts[g]`` answering ``prompts[g]``, tokenised by ``tok``
    (its own tokenizer), with made-up log-probs."""
    g = torch.Generator().manual_seed(seed)
    rows: dict[str, list] = {k: [] for k in ("group", "texts", "ids", "offsets", "logprobs")}
    for k, ts in enumerate(texts):
        for t in ts:
            ids = tok.encode(t, add_special_tokens=False)
            text, offs = _offsets(tok, ids)
            assert text == t
            rows["group"].append(k)
            rows["texts"].append(t)
            rows["ids"].append(ids)
            rows["offsets"].append(offs)
            rows["logprobs"].append((-torch.rand(len(ids), generator=g) * 3).tolist())
    n = len(rows["texts"])
    return Experience(
        "bpe", 0, prompts, eos=[True] * n, eos_logprob=[-0.5] * n, finish=["stop"] * n, **rows
    )


def test_log_probs_cross_tokenizers_block_by_block_exactly():
    """Every aligned block's (and so the response's) log-prob is the peer's, exactly."""
    char = tiny.build_tokenizer()
    bpe = tiny.build_bpe_tokenizer(make_task("arithmetic", digits=2))
    from rlpost.llm.model.tokalign import align

    g = torch.Generator().manual_seed(0)
    merged = 0
    for text in ["57", "123+45=168", "9*(8-7)=9", "100"]:
        mine, theirs = tokenize(char, text), tokenize(bpe, text)
        merged += len(theirs.ids) < len(mine.ids)
        lp = (-torch.rand(len(theirs.ids), generator=g) * 4).tolist()
        carried = carry_logprobs(mine, theirs, lp)
        al = align(mine, theirs)
        for (sa, ea), (sb, eb) in zip(al.a, al.b, strict=True):
            assert carried[sa:ea].sum().item() == pytest.approx(sum(lp[sb:eb]), abs=1e-5)
        assert carried.sum().item() == pytest.approx(sum(lp), abs=1e-5)
    assert merged >= 2  # the BPE cuts most of these texts into fewer, longer tokens


def test_sgt_transfers_only_verified_successes_into_the_rescue_set(fast_cfg, bpe_policy):
    from rlpost.llm.trainer import Trainer

    cfg = fast_cfg("algo.preset=sgt", _policies(bpe_policy), "mutual.member=char", LONG)
    tr = Trainer(cfg, overwrite=True)
    try:
        col = tr.collect()
        groups, first, prompts, answers = _groups(col)
        # the policy solved group 0 itself (its verdict), none of the others
        acc = torch.zeros_like(col.accuracy)
        acc[first[0]] = 1.0
        col = replace(col, accuracy=acc)
        wrong = [str(int(a) + 1) for a in answers]
        bpe = tiny.build_bpe_tokenizer(make_task("arithmetic", digits=2))
        peer = _peer_experience(bpe, prompts, [[a, w] for a, w in zip(answers, wrong, strict=True)])
        out = import_experience(tr, col, [peer])
        transferred = torch.nonzero(out.roles == TRAIN).flatten().tolist()
        texts = out.batch.texts(tr.tok)
        # one verified success per unsolved group, nothing for group 0, no wrong answer
        assert sorted(texts[i] for i in transferred) == sorted(answers[1:])
        assert all(out.rewards[i] == 1.0 and out.accuracy[i] == 1.0 for i in transferred)
        assert out.metrics["mutual/trained"] == len(groups) - 1
        assert (out.roles == OWN).sum() == len(col.batch)
        # the transferred rows carry the peer's log-prob of the text, plus its EOS
        for i in transferred:
            r = peer.texts.index(texts[i])
            m = out.batch.mask[i] > 0
            assert out.batch.logprobs[i][m].sum().item() == pytest.approx(
                sum(peer.logprobs[r]) - 0.5, abs=1e-5
            )
        # groups stay contiguous, each row's example is its group's
        g = out.batch.group.tolist()
        assert g == sorted(g)
        assert all(out.examples[i].prompt == prompts[g[i]] for i in range(len(g)))
    finally:
        tr.close()


def _update_weights(tr, col, state, opt_state):
    tr.model.load_state_dict(state)
    tr.optimizer.load_state_dict(opt_state)
    tr.update(col)
    return [p.detach().clone() for p in tr.model.parameters()]


def test_xgrpo_peers_shape_the_baseline_and_carry_no_gradient(fast_cfg, bpe_policy):
    """Two XGRPO batches whose peer rows differ in text but not in reward give the same
    update; trained on (PRP's role) the same rows give different updates; and the peers'
    rewards do move the policy's own advantages."""
    from rlpost.llm.trainer import Trainer

    cfg = fast_cfg("algo.preset=xgrpo", _policies(bpe_policy), "mutual.member=char", LONG)
    tr = Trainer(cfg, overwrite=True)
    try:
        col = tr.collect()
        groups, _, prompts, answers = _groups(col)
        bpe = tiny.build_bpe_tokenizer(make_task("arithmetic", digits=2))
        a = _peer_experience(bpe, prompts, [[x, str(int(x) + 1)] for x in answers])
        b = _peer_experience(bpe, prompts, [[x, str(int(x) + 7)] for x in answers], seed=1)
        col_a, col_b = import_experience(tr, col, [a]), import_experience(tr, col, [b])
        assert (col_a.roles == BASELINE).sum() == 2 * len(groups)
        assert torch.equal(col_a.rewards, col_b.rewards)
        state = copy.deepcopy(tr.model.state_dict())
        opt = copy.deepcopy(tr.optimizer.state_dict())
        wa = _update_weights(tr, col_a, state, opt)
        wb = _update_weights(tr, col_b, state, opt)
        assert all(torch.equal(x, y) for x, y in zip(wa, wb, strict=True))
        plain = _update_weights(tr, col, state, opt)  # the peers' rewards change the baseline
        assert any(not torch.equal(x, y) for x, y in zip(wa, plain, strict=True))
        trained = [
            replace(c, roles=torch.where(c.roles == BASELINE, TRAIN, c.roles))
            for c in (col_a, col_b)
        ]
        ta = _update_weights(tr, trained[0], state, opt)
        tb = _update_weights(tr, trained[1], state, opt)
        assert any(not torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    finally:
        tr.close()


def test_export_then_import_round_trips_a_policys_own_responses(fast_cfg, bpe_policy):
    """A policy's experience read back by a policy with the same tokenizer reproduces its
    token ids and log-probs exactly (the same-tokenizer case of the alignment)."""
    from rlpost.llm.trainer import Trainer

    cfg = fast_cfg("algo.preset=prp", _policies(bpe_policy), "mutual.member=char", LONG)
    tr = Trainer(cfg, overwrite=True)
    try:
        col = tr.collect()
        exp = export_experience(tr, col, "char")
        out = import_experience(tr, col, [exp])
        own = torch.nonzero(out.roles == OWN).flatten()
        peer = torch.nonzero(out.roles == TRAIN).flatten()
        assert len(peer) == len(own) == len(col.batch)
        for i, j in zip(own.tolist(), peer.tolist(), strict=True):  # pooled next to its twin
            m = out.batch.mask[i] > 0
            assert torch.equal(out.batch.completion_ids[i][m], out.batch.completion_ids[j][m])
            assert torch.allclose(out.batch.logprobs[i][m], out.batch.logprobs[j][m], atol=1e-6)
            assert out.rewards[i] == out.rewards[j]
    finally:
        tr.close()


def test_mutual_config_errors_name_the_problem(fast_cfg, bpe_policy):
    with pytest.raises(ConfigError, match=r"set mutual\.policies"):
        fast_cfg("algo.preset=sgt")
    with pytest.raises(ConfigError, match=r"mutual\.policies\[b\]: .*'nope'"):
        fast_cfg("algo.preset=sgt", "mutual.policies=[{name: a}, {name: b, preset: nope}]")
    with pytest.raises(ConfigError, match="names must be unique"):
        fast_cfg("algo.preset=sgt", "mutual.policies=[{name: a}, {name: a}]")


@pytest.mark.slow  # (the slow tier: uv run pytest -m slow)
def test_two_tokenizers_train_together_on_ray(fast_cfg, bpe_policy, tmp_path):
    """The character Qwen2 and the BPE Llama run as Ray actors for two steps, each
    receiving the other's responses every step; the run directory is one run."""
    cfg = fast_cfg(
        "algo.preset=prp", _policies(bpe_policy), f"run.dir={tmp_path / 'mutual'}",
        "run.save_every=1",
    )  # fmt: skip
    summary = run_mutual(cfg, progress=False)
    assert set(summary["policies"]) == {"char", "bpe"}
    for name in ("char", "bpe"):
        rows = [
            json.loads(line)
            for line in (tmp_path / "mutual" / "policies" / name / "metrics.jsonl").open()
        ]
        steps = [r for r in rows if "mutual/received" in r]
        assert [r["step"] for r in steps] == [1, 2]
        assert all(r["mutual/received"] == 16 for r in steps)  # 4 prompts x 4 responses
        assert summary["policies"][name]["step"] == 2
    with pytest.raises(ValueError, match="holds a Mutual RL run"):
        run_mutual(cfg, progress=False)


def test_without_ray_the_error_says_how_to_get_it(monkeypatch):
    import sys

    from rlpost.llm.rollout.cluster import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ValueError, match=r"mutual\.backend=ray runs on Ray.*rlpost-llm\[ray\]"):
        import_ray("mutual.backend=ray")
