"""The search environment (BM25 over our corpus) and A²TGPO's information gain."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.base import play
from rlpost.llm.data.envs.search import build_corpus, parse_fact, words
from rlpost.llm.data.envs.search_corpus import main
from rlpost.llm.rollout.agents import env_rollout
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.fake import ActionScriptEngine
from rlpost.llm.rollout.sources.episodes import information_gain


def test_the_corpus_and_the_bm25_words():
    docs = build_corpus(0)
    assert docs == build_corpus(0) and docs != build_corpus(1)
    assert len(docs) == 90 * 3 and all(parse_fact(d) for d in docs)
    assert words("17*42") == ["17", "17*", "42"] and words("17") == ["17"]


def test_deterministic_under_a_seed_and_every_demonstration_solves():
    a, b = make_env("search"), make_env("search")
    hops = set()
    for seed in range(200):
        assert a.reset(seed) == b.reset(seed) and a.demonstrate() == b.demonstrate()
        hops.add(len(a.rels))
        res = play(a, a.demonstrate())
        assert all(r.info["valid"] for r in res)
        assert res[-1].done and res[-1].reward == 1.0 and res[-1].info["solved"]
        # progress: every chain fact retrieved once, then the answer
        assert sum(r.info["gain"] for r in res) == len(a.rels) + 1
    assert hops == {1, 2}


def test_retrieval_and_the_verifier_are_exact():
    env = make_env("search", min_hops=2, max_hops=2)
    env.reset(4)
    e, (r1, r2) = env.start, env.rels
    mid, end = env.chain[1], env.chain[2]
    res = env.step(f":{e}{r1}")  # the precise query ranks its fact first
    assert res.observation.split(" ")[0] == f"{e}{r1}{mid}" and res.info["gain"] == 1.0
    vague = env.step(f":{e}")  # the entity alone: documents that mention it
    assert all(str(e) in d for d in vague.observation[:-1].split(" "))
    wrong = env.step(f"={mid}")  # the first hop is not the answer
    assert wrong.done and wrong.reward == 0.0
    env.reset(4)
    play(env, [f":{e}{r1}", f":{mid}{r2}"])
    assert env.step(f"={end}").reward == 1.0
    env.reset(4)
    bad = env.step("hello")
    assert not bad.info["valid"] and bad.observation == "()>"
    env.reset(4)
    out = play(env, [":"] * 10)  # no word: invalid; the budget ends the episode
    assert out[-1].done and out[-1].reward == 0.0 and len(out) == env.limit


def test_a_user_corpus_and_the_corpus_script(tmp_path):
    path = tmp_path / "corpus.jsonl"
    assert main(["--out", str(path), "--seed", "3"]) == 0
    docs = [json.loads(x)["text"] for x in path.read_text().splitlines()]
    assert docs == build_corpus(3)
    env = make_env("search", corpus=str(path))
    env.reset(0)
    assert play(env, env.demonstrate())[-1].reward == 1.0
    with pytest.raises(ValueError, match="does not exist"):
        make_env("search", corpus=str(tmp_path / "none.jsonl"))


def test_information_gain_is_the_change_in_the_truths_probability():
    """Against a one-sequence-at-a-time formulation: P(truth | context) from a plain
    forward of each context followed by the truth, no padding, no batching."""
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny.tiny_config(tok)).eval()
    make = lambda: make_env("search", min_hops=1, max_hops=1)  # noqa: E731
    envs = [make() for _ in range(2)]
    for e, seed in zip(envs, (2, 5), strict=True):
        e.reset(seed)
    scripts = [[":11*", f":{e.start}{e.rels[0]}", e.ground_truth()] for e in envs]
    eng = ActionScriptEngine(tok, scripts)
    ro = env_rollout(eng, tok, make, [2, 5], 1, SamplingParams(6, 1.0), 3)
    assert ro.truths == [e.ground_truth() for e in envs] and ro.solved.all()
    ig = information_gain(model, tok, ro, micro_batch=3)
    for i in range(2):
        truth = [*tok.encode(ro.truths[i], add_special_tokens=False), tok.eos_token_id]
        tid = ro.turn_ids[i].tolist()
        starts = [0] + [j for j in range(1, len(tid)) if tid[j] >= 0 and tid[j] != tid[j - 1]]
        probs = []
        for c in starts:
            ctx = list(ro.batch.prompt_ids[i]) + ro.batch.completion_ids[i, :c].tolist()
            seq = torch.tensor([ctx + truth])
            with torch.no_grad():
                logp = model(seq).logits.log_softmax(-1)[0]
            probs.append(sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(truth)))
        want = [float(torch.tensor(probs[k + 1]).exp() - torch.tensor(probs[k]).exp())
                for k in range(len(starts) - 1)]  # fmt: skip
        assert len(starts) == 3  # turns 0, 1 and the answer
        torch.testing.assert_close(ig[i, :2], torch.tensor(want), rtol=1e-3, atol=1e-12)
        assert ig[i, 2] == 0.0  # the answer turn: nothing follows it


def test_information_gain_refuses_a_chained_episode():
    """A chain poses several questions, so no single truth's probability is the gain."""
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    make = lambda: make_env("search", min_hops=1, max_hops=1, tasks=2)  # noqa: E731
    env = make()
    env.reset(3)
    (_, r1, c1), (_, r2, c2) = env.questions
    script = [[f":{c1[0]}{r1[0]}", f"={c1[-1]}", f":{c2[0]}{r2[0]}", f"={c2[-1]}"]]
    ro = env_rollout(ActionScriptEngine(tok, script), tok, make, [3], 1, SamplingParams(6, 1.0), 4)
    assert ro.solved.all()
    with pytest.raises(ValueError, match="chained episode"):
        information_gain(Qwen2ForCausalLM(tiny.tiny_config(tok)), tok, ro)


def test_a2tgpo_trains_on_information_gain_from_the_cli(fast_overrides, fast_cfg, tmp_path):
    from rlpost.apps.llm.cli import main as cli
    from rlpost.llm.config import ConfigError

    run = tmp_path / "ig"
    over = [
        *fast_overrides, "data.env={name: search, params: {slack: 0}, turn_signal: ig, max_turns: 4}",
        "algo.preset=a2tgpo", "rollout.max_new_tokens=4", f"run.dir={run}", "train.steps=1",
    ]  # fmt: skip
    assert cli(["train", "--config", "grpo_arithmetic", *over]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["step"] == 1]
    assert row["env/ig_abs_mean"] > 0 and row["adv/turn_groups"] > 0
    with pytest.raises(ConfigError, match="no ground truth"):
        fast_cfg("data.env={name: household, turn_signal: ig}")


def test_the_query_mask_marks_exactly_the_search_actions():
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    env = make_env("search", min_hops=1, max_hops=1)
    env.reset(3)
    make = lambda: make_env("search", min_hops=1, max_hops=1)  # noqa: E731
    script = [[f":{env.start}{env.rels[0]}", "hi", env.ground_truth()]]
    ro = env_rollout(ActionScriptEngine(tok, script), tok, make, [3], 1, SamplingParams(6, 1.0), 3)
    q, tid, m = ro.query_mask[0], ro.turn_ids[0], ro.batch.mask[0]
    assert ((q > 0) == (tid == 0)).all()  # the query's tokens (and its EOS), nothing else
    assert (q <= m).all() and m[tid == 1].sum() > 0 and m[tid == 2].sum() > 0


def test_sd_search_distils_only_query_tokens(fast_overrides, tmp_path, monkeypatch):
    """The JSD term's token mask is the rollout's query mask; with it, the distillation
    gradient of every other token is exactly 0."""
    from rlpost.core import get_preset
    from rlpost.core.distill import TeacherDistributions
    from rlpost.core.presets import PolicyBatch
    from rlpost.llm.config import load_config
    from rlpost.llm.trainer import Trainer

    cfg = load_config(None, [
        *fast_overrides, "data.env={name: search, max_turns: 4}", "algo.preset=sd_search",
        "distill.teachers=[{path: self, template: ':17* =42:{prompt}'}]",
        "rollout.max_new_tokens=5", "rollout.group_size=8", f"run.dir={tmp_path / 'sd'}",
        "train.steps=1",
    ])  # fmt: skip
    tr = Trainer(cfg)
    from rlpost.llm.train.inputs import Role

    seen = []
    teachers = tr.components.get("teachers")
    real = teachers.provide

    def spy(step):
        real(step)
        seen.append((step.col.query_mask.clone(), step[Role.TEACHER_MASK].clone()))

    monkeypatch.setattr(teachers, "provide", spy)
    tr.train()
    ((query, tmask),) = seen
    assert torch.equal(tmask, query * tmask.amax(1, keepdim=True))  # rows x query tokens
    # the loss: distillation gradients only where the teacher mask is 1
    recipe = get_preset("sd_search").build()
    B, T, K = 2, 5, 4
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, K, generator=g, requires_grad=True)
    student = logits.log_softmax(-1)
    teacher = torch.randn(B, T, K, generator=g).log_softmax(-1)
    mask = torch.ones(B, T)
    qmask = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]], dtype=torch.float)
    lp = student[..., 0]
    out = recipe.policy_loss(PolicyBatch(
        lp, lp.detach(), torch.zeros(B), mask, teacher_logp=teacher[..., 0],
        teacher_topk=TeacherDistributions(student, teacher, torch.zeros(B, T, dtype=torch.long)),
        teacher_mask=qmask, turn_ids=torch.zeros(B, T, dtype=torch.long),
    ))  # fmt: skip
    (grad,) = torch.autograd.grad(out.loss, logits)
    assert (grad[qmask == 0] == 0).all() and (grad[qmask == 1].abs().sum(-1) > 0).all()


def test_the_rubric_judge_scores_each_turn_against_its_stage():
    env = make_env("search", min_hops=2, max_hops=2)
    env.reset(4)
    e, (r1, r2), mid, end = env.start, env.rels, env.chain[1], env.chain[2]
    res = play(env, [f":{e}{r1}", f":{e}{r1}", "hello", f":{mid}{r2}", f"={end}"])
    judged = [env.judge(r.info) for r in res]
    # a new fact (1), the same fact again (valid, nothing new: 1/2), an invalid action
    # (0), the second fact (1), then the true answer grounded in both facts (1)
    assert judged == [(0, 1.0), (0, 0.5), (0, 0.0), (0, 1.0), (1, 1.0)]
    env.reset(4)
    (res,) = play(env, [f"={end}"])  # right, but nothing retrieved: not grounded
    assert env.judge(res.info) == (1, 0.5)
    env.reset(4)
    res = play(env, [f":{e}{r1}", f":{mid}{r2}", f"={mid}"])
    assert env.judge(res[-1].info) == (1, 0.5)  # grounded, wrong


@pytest.mark.parametrize("plan", [False, True])
def test_rubricem_trains_on_stage_judgments_from_the_cli(fast_overrides, fast_cfg, tmp_path, plan):
    from rlpost.apps.llm.cli import main as cli
    from rlpost.llm.config import ConfigError

    run = tmp_path / "rubric"
    params = "{slack: 0, plan: true}" if plan else "{slack: 0}"
    over = [
        *fast_overrides,
        f"data.env={{name: search, params: {params}, turn_signal: rubric, max_turns: 4}}",
        "algo.preset=rubricem", "rollout.max_new_tokens=4", f"run.dir={run}", "train.steps=1",
    ]  # fmt: skip
    assert cli(["train", "--config", "rubricem_search", *over]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["step"] == 1]
    assert 0.0 <= row["env/rubric_stage0"] <= 1.0 and row["adv/stages_per_traj"] >= 1.0
    assert ("env/rubric_stage2" in row) == plan  # the plan: every episode's first turn
    with pytest.raises(ConfigError, match="no rubric judge"):
        fast_cfg("data.env={name: household, turn_signal: rubric}")


def test_a_parameter_set_to_its_default_shares_the_default_base(tmp_path):
    from rlpost.llm.data.envs.pretrain import env_base_path

    def path(**params):
        return env_base_path("search", params, 800, 0, tmp_path)

    assert path(tasks=1) == path() == path(slack=0, hardened=True)  # episode-only too
    assert path(tasks=2) != path() and path(max_hops=3) != path()


def test_a_self_generated_rubric_comes_first_and_the_research_is_judged_against_it():
    env, plain = make_env("search", plan=True), make_env("search")
    for seed in range(100):  # the demonstrations: their own plan, then the same episode
        env.reset(seed)
        plain.reset(seed)
        demo = env.demonstrate()
        assert demo[1:] == plain.demonstrate() and env.limit == plain.limit + 1
        assert re.fullmatch(rf"\([01]{{{len(env.rels)}}}\)", demo[0])
        res = play(env, demo)
        assert res[-1].reward == 1.0 and res[0].info["planned"] == demo[0][1:-1]
        assert all(r.info["follows"] for r in res if "follows" in r.info)
        assert sum("follows" in r.info for r in res) == len(env.rels)  # a hop's first query
    env = make_env("search", plan=True, min_hops=2, max_hops=2)
    env.reset(4)
    e, (r1, r2), mid, end = env.start, env.rels, env.chain[1], env.chain[2]
    res = play(env, ["(10)", f":{e}{r1}", f":{mid}{r2}", f"={end}"])  # hop two opened precise
    judged = [env.judge(r.info) for r in res]
    # plan well-formed (stage 2: 1); hop one as planned (1); hop two against the plan
    # (valid and new, not as planned: 2/3); the true answer, grounded
    assert judged == [(2, 1.0), (0, 1.0), (0, 2 / 3), (1, 1.0)]
    assert res[0].info["log/plan_precise"] == 0.5 and res[0].observation == ">"
    env.reset(4)
    res = play(env, ["(1)", f":{e}{r1}"])  # one item for two hops: malformed, no rubric
    assert env.judge(res[0].info) == (2, 0.0) and res[0].observation == "()>"
    assert res[1].info["follows"] is False
    with pytest.raises(ValueError, match=r"plan .* needs tasks: 1"):
        make_env("search", plan=True, tasks=2)


# ------------------------------------------- RubricEM's reflection on judged episodes (000-30)


def test_a_judged_episode_is_rendered_with_each_turns_verdict_and_its_lesson():
    env = make_env("search", plan=True, reflect=True, slack=0, min_hops=2, max_hops=2)
    for seed in range(200):  # a question whose first hop a vague query does not retrieve
        env.reset(seed)
        e, (r1, r2), mid = env.start, env.rels, env.chain[1]
        if f"{e}{r1}{mid}" not in env.retriever.search(str(e), env.k):
            break
    q = f"{e}{r1}{r2}>"
    actions = ["(00)", f":{e}", f":{e}{r1}", f":{mid}"]  # vague, missed; the budget runs out
    res = play(env, actions)
    assert res[-1].done and res[-1].reward == 0.0
    infos = [r.info for r in res]
    # plan valid (1); a vague query as planned that found nothing new (follows, valid: 2/3,
    # so 0); the follow-up found the fact (valid, new; no "follows": 1); the next hop's
    # vague query as planned, and whether it found the fact decides its verdict
    mid_hit = any(d.startswith(f"{mid}{r2}") for d in env.retriever.search(str(mid), env.k))
    verdicts = f"(00)>1 :{e}>0 :{e}{r1}>1 :{mid}>{int(mid_hit)}"
    assert env.reflection_prompt(actions, infos) == f"{q}{verdicts}:"
    # the lesson: hop one precise (its vague query missed); hop two vague only if it hit
    assert env.lesson(actions, infos) == f"(1{0 if mid_hit else 1})"
    env.reset(seed)  # precise throughout: the lesson keeps every hop precise
    actions = ["(11)", f":{e}{r1}", f":{mid}{r2}", f"={env.chain[2]}"]
    infos = [r.info for r in play(env, actions)]
    assert env.lesson(actions, infos) == "(11)"
    with pytest.raises(ValueError, match=r"reflect .* needs plan: true"):
        make_env("search", reflect=True)


def test_the_reflection_base_learns_to_reflect_and_to_follow_guidance():
    import random

    from rlpost.llm.model.tiny import build_tokenizer

    tok = build_tokenizer()
    env = make_env("search", plan=True, reflect=True)
    rng = random.Random(0)
    kinds = {"reflect": 0, "guided": 0, "plain": 0}
    for seed in range(200):
        row = env.sft_row(tok, seed, rng)
        if row is None:
            kinds["plain"] += 1
            continue
        ids, labels = row
        text = tok.decode(ids)
        target = tok.decode([x for x in labels if x != -100])
        if text.split("<eos>")[0].endswith(":" + target.split("<eos>")[0]):
            kinds["reflect"] += 1  # a judged episode, then its lesson (and nothing else)
            assert re.fullmatch(r"\([01]+\)<eos>", target) and target.count("<eos>") == 1
            continue
        kinds["guided"] += 1  # "(01):<question>", then a plan equal to the guidance
        guide, rest = text.split(":", 1)
        assert re.fullmatch(r"\([01]+\)", guide) and target.startswith(guide + "<eos>")
        assert rest.split(">", 1)[1].startswith(guide)
    assert all(40 <= v <= 120 for v in kinds.values()), kinds
    assert make_env("search", plan=True).sft_row(tok, 0, rng) is None  # without reflect
