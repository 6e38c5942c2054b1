"""FBOS-RL's guided round in the trainer (000-15): guided prompts from diagnosed failures,
EPA's copies token for token under the bare prompt, ECC's groups, the same rollout budget
as GRPO, and the update EPA gives a prompt GRPO could not learn from."""

from __future__ import annotations

import random
import re

import pytest
import torch

from rlpost.core.feedback import FeedbackExploration
from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.config import ConfigError
from rlpost.llm.data.tasks import Example, make_task
from rlpost.llm.model.tiny import build_tokenizer
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.rollout.feedback import assemble, guided_contexts
from rlpost.llm.trainer import Trainer

ARITH = make_task("arithmetic", digits=2)


def _ex(a: int, b: int) -> Example:
    return Example(f"{a}+{b}=", str(a + b), {"a": a, "b": b, "op": "+"})


def test_the_guided_prompt_comes_from_the_first_failure_the_verifier_can_diagnose():
    fb = FeedbackExploration()
    exs = [_ex(28, 35), _ex(1, 1), _ex(2, 2)]
    texts = ["x", "53", "63", "2", "2", "2", "9", "9", "4"]  # 3 plain rollouts each
    correct = torch.tensor([ARITH.score(t, exs[i // 3]) > 0 for i, t in enumerate(texts)])
    ctx = guided_contexts(fb, exs, texts, correct, ARITH.feedback)
    # "x" is wrong but says nothing the verifier can diagnose: the next failure is used
    assert ctx == ["53+10>28+35=", None, "9-1>2+2="]
    with pytest.raises(ValueError, match="text prompts"):
        guided_contexts(
            fb, [Example([{"role": "user"}], "1", {})], ["1"], correct[:1], ARITH.feedback
        )


def _batch(prompts: list[list[int]], completions: list[list[int]], n: int) -> RolloutBatch:
    rows = [(prompts[i // n], c, [-0.5] * len(c), "stop") for i, c in enumerate(completions)]
    return RolloutBatch.from_rows(rows, len(prompts), n, pad_id=0)


def test_assembly_keeps_the_budget_and_copies_guided_solutions_token_for_token():
    fb = FeedbackExploration()
    prompts = [[10, 11], [20, 21]]
    plain = _batch(prompts, [[1], [2], [3], [4]], 2)  # 2 plain rollouts per prompt
    guided_prompt = [99, 10, 11]
    second = _batch([guided_prompt, prompts[1]], [[5, 6], [7], [8], [9]], 2)
    guided = torch.tensor([True, False])
    correct = torch.tensor([True, False, True, True])  # prompt 0's first guided one solves
    out = assemble(fb, plain, second, prompts, guided, correct)
    b = out.batch
    # prompt 0's group: its two plain rows and EPA's copy of the guided solution [5, 6]
    # under the bare prompt; prompt 1's group: its plain rows and its unguided second round
    assert b.group.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert b.prompt_ids[:3] == [prompts[0]] * 3 and b.prompt_ids[3:7] == [prompts[1]] * 4
    assert b.completion_ids[2, :2].tolist() == [5, 6] and b.mask[2].tolist() == [1.0, 1.0]
    assert out.roles.tolist() == [OWN, OWN, TRAIN, OWN, OWN, OWN, OWN, OWN, OWN]
    # ECC: both guided rollouts of prompt 0, in the guided context, a group of their own
    assert b.prompt_ids[7:] == [guided_prompt] * 2
    assert b.completion_ids[7:, :2].tolist() == [[5, 6], [7, 0]]
    assert out.example == [0, 0, 0, 1, 1, 1, 1, 0, 0]
    # every rollout generated is in the batch once as itself: 4 per prompt, as GRPO's 4
    own = out.source[out.roles == OWN].tolist()
    assert sorted(own) == list(range(len(plain) + len(second)))


def _script(tok):
    """Bare prompts get a wrong answer (0); prompts carrying feedback get the right one."""

    def script(prompt_ids, n):
        text = tok.decode(prompt_ids, skip_special_tokens=True)
        problem = text.split(">")[-1]
        a, b = problem.rstrip("=").split("+")
        answer = str(int(a) + int(b)) if ">" in text else "0"
        ids = [*tok.encode(answer, add_special_tokens=False), tok.eos_token_id]
        return [(ids, [-1.0] * len(ids), "stop")] * n

    return script


def test_the_guided_rounds_accuracy_is_compared_on_the_prompts_it_re_rolled(fast_cfg):
    """``fbos/guided_accuracy`` covers only the prompts with a diagnosed failure, so
    ``fbos/plain_accuracy_guided`` is the plain round on those same prompts (the overall
    plain accuracy also counts the prompts that needed no guidance)."""
    cfg = fast_cfg("algo.preset=fbos", "data.task_params={digits: 2}", "rollout.prompts_per_step=8")
    tr = Trainer(cfg)
    try:
        tok = tr.tok

        def script(prompt_ids, n):  # bare: right when the first operand is even
            text = tok.decode(prompt_ids, skip_special_tokens=True)
            a, b = text.split(">")[-1].rstrip("=").split("+")
            right = ">" in text or int(a) % 2 == 0
            ids = [*tok.encode(str(int(a) + int(b)) if right else "0", add_special_tokens=False)]
            return [([*ids, tok.eos_token_id], [-1.0] * (len(ids) + 1), "stop")] * n

        tr.engine = FakeEngine(script, pad_id=tok.pad_token_id)
        col = tr.collect()
        problems = list(dict.fromkeys(e.prompt for e in col.examples))  # (the 8 prompts)
        assert len(problems) == 8
        even = sum(int(p.split("+")[0]) % 2 == 0 for p in problems)
        assert 0 < even < 8, "the seed's prompts mix even and odd first operands"
        assert col.metrics["fbos/plain_accuracy"] == pytest.approx(even / 8)
        assert col.metrics["fbos/guided_prompts"] == pytest.approx(1 - even / 8)
        assert col.metrics["fbos/plain_accuracy_guided"] == 0.0
        assert col.metrics["fbos/guided_accuracy"] == 1.0
    finally:
        tr.close()


def _logp(model, tok, prompt: str, answer: str) -> float:
    p = tok.encode(prompt, add_special_tokens=False)
    a = [*tok.encode(answer, add_special_tokens=False), tok.eos_token_id]
    ids = torch.tensor([p + a])
    with torch.no_grad():
        logits = model(ids).logits[0, len(p) - 1 : -1].log_softmax(-1)
    return float(logits.gather(1, torch.tensor(a)[:, None]).sum())


@pytest.mark.parametrize("preset", ["fbos", "fbos_ecc"])
def test_epa_trains_the_bare_prompt_toward_the_solution_feedback_found(fast_cfg, preset):
    cfg = fast_cfg(
        f"algo.preset={preset}", "data.task_params={digits: 2}", "optim.lr=1e-3",
        "optim.micro_batch_size=64",
    )  # fmt: skip
    tr = Trainer(cfg)
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_script(tok), pad_id=tok.pad_token_id)
        col = tr.collect()
        P, G = 4, 4
        assert col.metrics["fbos/plain_accuracy"] == 0.0
        assert col.metrics["fbos/guided_prompts"] == 1.0
        assert col.metrics["fbos/guided_accuracy"] == 1.0
        epa = col.roles == TRAIN
        assert int(epa.sum()) == (P * G // 2 if preset == "fbos" else 0)
        assert col.metrics["fbos/rescued"] == (P if preset == "fbos" else 0)
        assert bool((col.rewards[epa] == 1.0).all())
        e = col.examples[0]
        before = _logp(tr.model, tok, e.prompt, e.answer)
        tr.update(col)
        gain = _logp(tr.model, tok, e.prompt, e.answer) - before
        if preset == "fbos":
            assert gain > 0.5  # the bare prompt learned the guided solution
        else:  # no EPA: every group is all-wrong or all-right, so no gradient at all
            assert abs(gain) < 1e-6
    finally:
        tr.close()


def test_a_feedback_aware_base_reads_a_diagnosis_pretrained_in_the_guided_format():
    task = make_task("arithmetic", digits=2)
    rng = random.Random(0)
    e = _ex(28, 35)
    w = task.wrong_attempt(e, rng)
    assert w is not None and w != "63" and task.feedback(w, e)
    cd = make_task("countdown")
    c = cd.sample(1, rng)[0]
    w = cd.wrong_attempt(c, rng)
    assert w is not None and cd.score(w, c) == 0.0 and cd.feedback(w, c) not in ("", "()")
    assert make_task("knapsack").wrong_attempt(c, rng) is None
    from rlpost.llm.model.tiny import _SFTRun

    run = _SFTRun(torch.nn.Linear(1, 1), build_tokenizer(), task, 1, 64, 1e-3, 0, feedback=1.0)
    shown = run._examples()
    for x in shown:  # "<attempt><+|-><place>><problem>", the answer unchanged
        diagnosis, problem = x.prompt.split(">")
        e = _ex(x.meta["a"], x.meta["b"])
        assert problem == e.prompt and x.answer == e.answer
        attempt = re.fullmatch(r"(\d+)[+-]\d+", diagnosis).group(1)
        assert attempt != e.answer and task.feedback(attempt, e) == diagnosis
    plain = _SFTRun(torch.nn.Linear(1, 1), build_tokenizer(), task, 1, 64, 1e-3, 0)
    assert not any(">" in x.prompt for x in plain._examples())


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["data.path=x.jsonl"], "data.path"),
        (["algo.dynamic_sampling=true"], "dynamic sampling"),
        (["algo.feedback={share: 2.0}"], "share"),
        (["algo.feedback={colour: red}"], "colour"),
        (["algo.preset=grpo", "algo.feedback={share: 0.5}"], "no feedback-guided round"),
    ],
)
def test_fbos_config_errors_name_the_problem(fast_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        fast_cfg("algo.preset=fbos", *overrides)


def test_fbos_trains_with_its_settings_overridden(fast_cfg):
    cfg = fast_cfg("algo.preset=fbos", "algo.feedback={share: 0.25, ecc: false}")
    from rlpost.llm.rollout.sources import preset_params

    assert preset_params(cfg.preset(), "feedback") == FeedbackExploration(share=0.25, ecc=False)
    tr = Trainer(cfg)
    try:
        tr.train()
    finally:
        tr.close()
    assert tr.step == 2


def test_each_domain_of_a_mixture_gets_its_own_verifiers_feedback(fast_cfg):
    cfg = fast_cfg("algo.preset=fbos", "data.mixture=[{task: arithmetic}, {task: countdown}]")
    tr = Trainer(cfg)
    try:
        tok = tr.tok

        def script(prompt_ids, n):  # a number for every prompt: wrong for both domains
            ids = [*tok.encode("7", add_special_tokens=False), tok.eos_token_id]
            return [(ids, [-1.0] * len(ids), "stop")] * n

        tr.engine = FakeEngine(script, pad_id=tok.pad_token_id)
        col = tr.collect()
        guided = {tok.decode(p) for p in col.batch.prompt_ids if ">" in tok.decode(p)}
        # arithmetic's diagnosis of "7" ("7+10>..." / "7-1>...") and countdown's ("7=12+>...")
        domains = {e.meta["domain"] for e in col.examples}
        assert domains == {"arithmetic", "countdown"}
        seen = set()
        for e, p in zip(col.examples, col.batch.prompt_ids, strict=True):
            text = tok.decode(p)
            if text not in guided or text == e.prompt:
                continue
            head = text[: len(text) - len(e.prompt) - 1]
            assert head == make_task(e.meta["domain"]).feedback("7", e)
            seen.add(e.meta["domain"])
        assert seen == domains  # both domains were guided, each by its own verifier
    finally:
        tr.close()


# ------------------------------------------------- RubricEM's reflection meta-policy (000-30)


def _reflect_script(tok):
    """Bare prompts: the wrong answer 0. Reflection prompts (``"a+b=0:"``): alternately the
    right lesson ``"+10"`` and a wrong one, ``"-1"``. Guided prompts: the right answer
    when the reflection they carry is ``"+10"``, else 0 again."""

    def enc(text: str):
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        return ids, [-1.0] * len(ids), "stop"

    def script(prompt_ids, n):
        text = tok.decode(prompt_ids, skip_special_tokens=True)
        if text.endswith(":"):
            return [enc("+10" if k % 2 == 0 else "-1") for k in range(n)]
        problem = text.split(">")[-1]
        a, b = problem.rstrip("=").split("+")
        right = ">" in text and text.split(">")[0].endswith("+10")
        return [enc(str(int(a) + int(b)) if right else "0")] * n

    return script


@pytest.mark.parametrize("meta", [True, False])
def test_the_reflection_meta_policy_is_trained_on_the_verdicts_of_the_attempts_it_guided(
    fast_cfg, meta
):
    cfg = fast_cfg(
        "algo.preset=rubricem_reflect", "data.task_params={digits: 2}", "optim.lr=1e-3",
        "optim.micro_batch_size=64", f"algo.feedback={{meta: {str(meta).lower()}}}",
    )  # fmt: skip
    tr = Trainer(cfg)
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_reflect_script(tok), pad_id=tok.pad_token_id)
        col = tr.collect()
        P, m = 4, 2  # group 4: 2 plain, 2 guided
        assert col.metrics["fbos/plain_accuracy"] == 0.0
        assert col.metrics["fbos/guided_prompts"] == 1.0
        assert col.metrics["fbos/guided_accuracy"] == 0.5  # the "+10"-guided half
        # exact: a reflection equal to the verifier's lesson on "0" ("+10" below 100)
        bare = {e.prompt: e for e in col.examples}.values()
        short_by_tens = [ARITH.lesson(ARITH.feedback("0", e)) == "+10" for e in bare]
        assert col.metrics["reflect/exact"] == 0.5 * sum(short_by_tens) / len(short_by_tens)
        texts = [tok.decode(p) for p in col.batch.prompt_ids]
        asks = [i for i, t in enumerate(texts) if t.endswith(":")]
        guided = {t for t in texts if ">" in t}
        # each guided rollout read its own reflection: "0+10>..." and "0-1>..."
        assert {t.split(">")[0] for t in guided} == {"0+10", "0-1"}
        if not meta:
            assert asks == [] and "reflect/rows" not in col.metrics
            return
        assert len(asks) == P * m and col.metrics["reflect/rows"] == P * m
        written = [tok.decode(col.batch.completion_ids[i][col.batch.mask[i] > 0]) for i in asks]
        for i, w in zip(asks, written, strict=True):  # judge-gated: the guided verdict
            assert float(col.rewards[i]) == (1.0 if w.startswith("+10") else 0.0)
            assert texts[i] == col.examples[i].prompt + "0:"
        assert bool((col.roles[asks] == TRAIN).all())  # trained, not counted as rollouts
        groups = col.batch.group[asks]
        assert len(set(groups.tolist())) == P  # a group per judged failure, m each
        assert not set(groups.tolist()) & set(col.batch.group[: asks[0]].tolist())
        ask = texts[asks[0]]
        before = _logp(tr.model, tok, ask, "+10") - _logp(tr.model, tok, ask, "-1")
        tr.update(col)
        after = _logp(tr.model, tok, ask, "+10") - _logp(tr.model, tok, ask, "-1")
        assert after - before > 0.5  # the guidance that led to solutions is reinforced
    finally:
        tr.close()


def test_a_reflection_base_is_shown_failed_attempts_with_the_lesson_of_their_diagnosis():
    from rlpost.llm.model.tiny import _SFTRun

    task = make_task("arithmetic", digits=2)
    run = _SFTRun(
        torch.nn.Linear(1, 1), build_tokenizer(), task, 1, 64, 1e-3, 0, feedback=0.5,
        reflect=0.5,
    )  # fmt: skip
    shown = run._examples()
    kinds = {"reflect": 0, "guided": 0, "bare": 0}
    for x in shown:
        e = _ex(x.meta["a"], x.meta["b"])
        if x.prompt.endswith(":"):  # "<problem><attempt>:" -> "<+|-><place>"
            attempt = x.prompt[len(e.prompt) : -1]
            assert x.prompt.startswith(e.prompt) and attempt != e.answer
            assert x.answer == task.lesson(task.feedback(attempt, e))
            assert re.fullmatch(r"[+-]10*", x.answer)
            kinds["reflect"] += 1
        else:
            kinds["guided" if ">" in x.prompt else "bare"] += 1
            assert x.answer == e.answer
    assert all(kinds.values()), kinds


@pytest.mark.parametrize(
    ("feedback", "match"),
    [
        ("{reflector: oracle}", "verifier or policy"),
        ("{reflector: verifier, meta: true}", "needs reflector: policy"),
        ("{reflect_template: '{prompt}:'}", "must contain {response}"),
    ],
)
def test_reflection_config_errors_name_the_problem(fast_cfg, feedback, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        fast_cfg("algo.preset=rubricem_reflect", f"algo.feedback={feedback}")


def test_the_guided_round_is_validated_against_the_group_size():
    """The preset names its ``feedback`` rollout source; the trainer's config validates the
    source's settings against the group (moved here from the core's presets test)."""
    from rlpost.llm.config import load_config

    with pytest.raises(ConfigError, match=r"preset 'fbos': .*group_size >= 2"):
        load_config(None, ["algo.preset=fbos", "rollout.group_size=1"])


def test_the_guidance_bank_keeps_verified_reflections_for_later_problems(fast_cfg):
    """RubricEM's reusable guidance: a reflection whose guided attempt was verified is
    kept (ranked by how often it led to one), offered as ``{guidance}`` to the next
    step's attempts at other problems, and kept in the checkpoint."""
    over = (
        "algo.preset=rubricem_reflect", "data.task_params={digits: 2}", "run.save_every=1",
        "algo.feedback={bank: 4, show: 2, template: '{guidance}:{response}{feedback}>{prompt}'}",
    )  # fmt: skip
    tr = Trainer(fast_cfg(*over, "train.steps=1"))
    try:
        tok = tr.tok
        tr.engine = FakeEngine(_reflect_script(tok), pad_id=tok.pad_token_id)
        source = next(s for s in tr.rollouts.chain() if s.name == "feedback")
        col = tr.collect()
        first = [tok.decode(p) for p in col.batch.prompt_ids if ">" in tok.decode(p)]
        assert first and all(t.startswith(":") for t in first)  # the bank was empty
        # each of the 4 prompts: one "+10"-guided attempt verified, one "-1"-guided not
        assert source.bank.entries == {"+10": [4, 0]}
        assert col.metrics["reflect/bank_size"] == 1.0
        again = tr.collect()
        later = [tok.decode(p) for p in again.batch.prompt_ids if ">" in tok.decode(p)]
        assert later and all(t.startswith("+10:") for t in later)
        assert source.bank.entries["+10"][0] == 8
        tr.train()  # (one step: its rollouts add 4 more, then the checkpoint)
        saved = source.bank.state_dict()
        assert saved["entries"]["+10"][0] == 12
    finally:
        tr.close()
    resumed = Trainer(fast_cfg(*over, "train.steps=2"), resume=True)
    try:
        kept = next(s for s in resumed.rollouts.chain() if s.name == "feedback").bank
        assert kept.state_dict() == saved
    finally:
        resumed.close()
