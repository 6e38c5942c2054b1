"""RubricEM's reflection meta-policy on multi-turn episodes (000-30): the policy reflects
on each task's first failed episode as the rubric judge scored it, half the group's
episodes read a reflection each, and the reflections are trained on the outcomes of the
episodes they guided, with Stage-Structured GRPO's stages in the same batch."""

from __future__ import annotations

import re

import pytest

from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.config import ConfigError
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.trainer import Trainer

from .test_feedback import _logp

ENV = (
    "data.env={name: search, params: {plan: true, reflect: true, slack: 0, min_hops: 2, "
    "max_hops: 2}, turn_signal: rubric, max_turns: 5}"
)


def _policy(tok):
    """A scripted searcher. Plain episodes plan hop one vague, hop two precise (``(01)``);
    a guided one plans what its guidance says. It follows its plan (a vague query first,
    then the precise one where the fact was not retrieved) and answers once the chain is
    known. Reflections alternate between all precise (``(11)``) and the plain plan."""

    def enc(text: str):
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        return ids, [-1.0] * len(ids), "stop"

    def act(text: str) -> str:
        parts = text.split("<eos>")  # prompt + action 1, then observation + action k
        guide, _, question = parts[0].rpartition(":") if ":" in parts[0].split(">")[0] else (
            "", "", parts[0])  # fmt: skip
        start, rels = re.match(r"(\d+)([+*-]+)>", question).groups()
        plan = guide if re.fullmatch(rf"\([01]{{{len(rels)}}}\)", guide) else "(01)"
        if len(parts) == 1:
            return plan
        facts = {}
        for obs in parts[1:]:
            for s, r, o in re.findall(r"(\d+)([+*-])(\d+)", obs[: obs.rfind(">") + 1]):
                facts[(s, r)] = o
        asked = [p[p.rfind(">") + 1 :] for p in parts[1:-1]] + [parts[0][len(text) :]]
        e = start
        for j, r in enumerate(rels):
            if (e, r) not in facts:
                vague = plan[1 + j] == "0" and f":{e}" not in asked
                return f":{e}" if vague else f":{e}{r}"
            e = facts[(e, r)]
        return f"={e}"

    def script(prompt_ids, n):
        text = tok.decode(prompt_ids)
        if text.endswith(":"):  # a judged episode to reflect on
            return [enc("(11)" if k % 2 == 0 else "(01)") for k in range(n)]
        return [enc(act(text))] * n

    return script


@pytest.mark.parametrize("meta", [True, False])
def test_reflections_on_judged_episodes_guide_half_the_group_and_are_trained_on_them(
    fast_cfg, meta
):
    cfg = fast_cfg(
        "algo.preset=rubricem_episodes", ENV, "rollout.max_new_tokens=5", "optim.lr=1e-3",
        "optim.micro_batch_size=64", "rollout.prompts_per_step=8",
        f"algo.episode_reflection={{meta: {str(meta).lower()}}}",
    )  # fmt: skip
    tr = Trainer(cfg)
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_policy(tok), pad_id=tok.pad_token_id)
        col = tr.collect()
        P, n, m = 8, 2, 2
        texts = [tok.decode(p) for p in col.batch.prompt_ids]
        asks = [i for i, x in enumerate(texts) if x.endswith(":")]
        guided = [i for i, x in enumerate(texts) if x.startswith("(")]
        failed = col.metrics["reflect/tasks"] * P
        assert 0 < failed < P, "hop one's vague query misses on some tasks, not all"
        # each reflected task: m guided episodes, one per reflection, "(11):..." and "(01):..."
        assert len(guided) == failed * m
        assert sorted(texts[i][:5] for i in guided) == sorted(["(01):", "(11):"] * int(failed))
        # all-precise guidance always solves (slack 0), the plain plan fails again
        for i in guided:
            assert float(col.rewards[i]) == float(texts[i].startswith("(11)"))
        assert col.metrics["reflect/guided_solved"] == 0.5
        assert col.metrics["reflect/plain_solved_reflected"] < 1.0
        groups = col.batch.group
        plain = [i for i in range(len(texts)) if i not in guided and i not in asks]
        assert len(plain) == P * n + (P - failed) * m  # unguided extras: their task's group
        assert not set(groups[guided].tolist()) & set(groups[plain].tolist())
        assert len(set(groups[guided].tolist())) == failed  # a group per guided task
        stages = col.turn_stages
        assert bool((stages[plain + guided, 0] == 2).all())  # the plan: the first turn
        if not meta:
            assert asks == []
            return
        assert len(asks) == failed * m and col.metrics["reflect/rows"] == failed * m
        assert bool((col.roles[asks] == TRAIN).all()) and bool((col.roles[plain] == OWN).all())
        assert bool((stages[asks] == -1).all())  # no rubric stage: the outcome term only
        written = [tok.decode(col.batch.completion_ids[i][col.batch.mask[i] > 0]) for i in asks]
        for i, w in zip(asks, written, strict=True):  # the outcome of the episode it guided
            assert float(col.rewards[i]) == float(w.startswith("(11)"))
            assert bool((col.turn_ids[i][col.batch.mask[i] > 0] == 0).all())
        assert len(set(groups[asks].tolist())) == failed  # a group per judged failure
        ask = texts[asks[0]]
        assert re.fullmatch(r"\d+[+*-]{2}>\(01\)>1( :\d+[+*-]?>[01])+:", ask)
        before = _logp(tr.model, tok, ask, "(11)") - _logp(tr.model, tok, ask, "(01)")
        tr.update(col)
        after = _logp(tr.model, tok, ask, "(11)") - _logp(tr.model, tok, ask, "(01)")
        assert after - before > 0.5  # guidance that led to solved episodes is reinforced
    finally:
        tr.close()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ((), r"needs turns \(set data.env"),
        (("data.env={name: search, params: {plan: true}}",), "is not an environment that renders"),
        (("data.env={name: household}",), "is not an environment that renders"),
    ],
)
def test_episode_reflection_config_errors_name_the_problem(fast_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        fast_cfg("algo.preset=rubricem_episodes", *overrides)


def test_two_attempts_the_second_guided_by_the_policys_own_reflection(fast_cfg):
    from rlpost.llm.rollout.sources.reflect import reflective_success

    tr = Trainer(fast_cfg("algo.preset=rubricem", ENV, "rollout.max_new_tokens=5"))
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_policy(tok), pad_id=tok.pad_token_id)
        seeds = [10**9 + i for i in range(16)]
        out = reflective_success(tr, seeds)
        # the plain plan "(01)" solves where hop one's vague query hits; the greedy
        # reflection "(11)" then solves every other task at the second attempt
        assert 0.0 < out["first"] < 1.0 and out["two_attempts"] == 1.0
        assert 0.0 <= out["exact"] <= 1.0
    finally:
        tr.close()
