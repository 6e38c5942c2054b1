"""The self-teacher's memory: RESD's reflections and persistent playbook (000-26), PMD's
three-level procedural memory updated from the rollouts (004-22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpost.llm.config import ConfigError, MemoryConfig
from rlpost.llm.data.tasks import Example, make_task
from rlpost.llm.methods.memory import Playbook, TeacherMemory

ARITH = make_task("arithmetic", digits=2)


def _ex(a: int, b: int) -> Example:
    return Example(f"{a}+{b}=", str(a + b), {"a": a, "b": b, "op": "+"})


def test_verifier_feedback_diagnoses_the_error_and_its_lesson_drops_the_problem():
    e = _ex(28, 35)  # 63
    assert ARITH.feedback("53", e) == "53+10"  # short by tens: a missed carry
    assert ARITH.feedback("64", e) == "64-1"
    assert ARITH.feedback("63", e) == "" and ARITH.feedback("x", e) == ""
    assert ARITH.lesson("53+10") == "+10" and ARITH.lesson("") == ""
    cd = make_task("countdown")
    c = Example("4 9 3>108:", "3*4*9", {"numbers": [4, 9, 3], "target": 108})
    assert cd.feedback("4*9+3", c) == "39=108+" and cd.lesson("39=108+") == "+"
    assert cd.feedback("4*4", c) == "()"  # a number used more often than given
    assert cd.feedback("3*4*9", c) == ""


def test_the_playbook_persists_across_steps_and_ranks_lessons_by_how_often_met():
    mem = TeacherMemory(MemoryConfig(kind="playbook", show=2), {"": ARITH})
    exs = [_ex(28, 35), _ex(19, 24), _ex(40, 2)]  # 63, 43, 42
    out = mem.observe(exs, ["53", "33", "41"], [False, False, False], step=0)
    assert [o.meta["reflection"] for o in out] == ["53+10", "33+10", "41+1"]
    assert all(o.meta["playbook"] == "+10 +1" for o in out)
    # a later step with no failure: the playbook still holds step 0's lessons
    later = mem.observe([_ex(1, 1)], ["2"], [True], step=1)
    assert later[0].meta["playbook"] == "+10 +1" and later[0].meta["reflection"] == ""
    assert mem.playbook.entries["+10"] == [2, 0]
    # a lesson met more often overtakes
    mem.observe([_ex(5, 5)] * 3, ["11"] * 3, [False] * 3, step=2)
    assert mem.playbook.top(2) == ["-1", "+10"]


def test_a_full_playbook_drops_the_least_met_lesson():
    book = Playbook(capacity=2)
    book.add("a", 0, times=3)
    book.add("b", 1)
    book.add("c", 2, times=2)
    assert set(book.entries) == {"a", "c"}


def test_procedural_memory_is_updated_from_rollouts_at_three_levels():
    mem = TeacherMemory(MemoryConfig(kind="procedural", show=3), {"": ARITH})
    p, q = _ex(28, 35), _ex(17, 46)  # 63, 63
    # step 0: both fail with a missed carry; the lesson recurs on two problems: a pattern
    out = mem.observe([p, q], ["53", "53"], [False, False], step=0)
    assert out[0].meta["trajectory"] == "53+10"  # raw trajectory: the failure's reflection
    assert out[0].meta["lessons"] == "+10" and out[0].meta["patterns"] == "+10"
    # step 1: p is solved: its trajectory becomes the verified success, and stays
    mem.observe([p], ["63"], [True], step=1)
    out = mem.observe([p, q], ["62", "62"], [False, False], step=2)
    assert out[0].meta["trajectory"] == "63"
    assert out[1].meta["trajectory"] == "62+1"
    assert mem.metrics()["memory/solved_problems"] == 1.0
    # the state round-trips (a checkpoint)
    copy = TeacherMemory(MemoryConfig(kind="procedural", show=3), {"": ARITH})
    copy.load_state_dict(json.loads(json.dumps(mem.state_dict())))
    a = mem.observe([q], ["1"], [False], step=3)[0].meta
    b = copy.observe([q], ["1"], [False], step=3)[0].meta
    assert a == b


def test_the_policy_reflector_writes_from_its_template():
    seen: list[str] = []

    def generate(prompts):
        seen.extend(prompts)
        return ["  carry  the\n one  "] * len(prompts)

    cfg = MemoryConfig(reflector="policy", reflect_template="{prompt}{response}|{feedback}?")
    mem = TeacherMemory(cfg, {"": ARITH}, generate)
    out = mem.observe([_ex(28, 35), _ex(1, 1)], ["53", "2"], [False, True], step=0)
    assert seen == ["28+35=53|53+10?"]  # only the failure is reflected on
    assert out[0].meta["reflection"] == "carry the one" and out[1].meta["reflection"] == ""


def test_memory_config_errors_name_the_problem(fast_cfg):
    with pytest.raises(ConfigError, match=r"no distill\.teachers\[\]\.template reads it"):
        fast_cfg(
            "algo.preset=resd", "rollout.group_size=1", "distill.teachers=[{path: self}]",
            "distill.memory={kind: playbook}",
        )  # fmt: skip


def test_resd_trains_with_its_playbook_in_the_teachers_context_and_resumes_it(
    fast_cfg, monkeypatch, tmp_path
):
    from rlpost.llm.methods.distill import Teachers
    from rlpost.llm.trainer import Trainer

    prompts: list[dict] = []
    score = Teachers.score

    def spy(self, batch, examples, *a, **k):
        prompts.extend(e.meta for e in examples)
        return score(self, batch, examples, *a, **k)

    monkeypatch.setattr(Teachers, "score", spy)
    over = (
        "algo.preset=resd", "rollout.group_size=1", "rollout.prompts_per_step=8",
        "data.task_params={digits: 2}", "run.save_every=1",
        "distill.teachers=[{path: self, template: '{playbook}:{reflection}>{prompt}'}]",
        "distill.memory={kind: playbook}",
    )  # fmt: skip
    tr = Trainer(fast_cfg(*over, "train.steps=1"))
    tr.train()
    assert len(prompts) == 8 and all("playbook" in m and "reflection" in m for m in prompts)
    failed = [m for m in prompts if m["reflection"]]
    assert failed and all(m["playbook"] for m in prompts)  # every row sees the lessons
    state = tr.components.get("teachers").memory.state_dict()
    resumed = Trainer(fast_cfg(*over, "train.steps=2"), resume=True)
    assert resumed.components.get("teachers").memory.state_dict() == state
    resumed.train()
    rows = [json.loads(x) for x in (Path(tr.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "memory/lessons" in r] == [1, 2]


def test_a_curriculum_stage_is_reflected_on_by_its_own_task(fast_cfg):
    """Each stage's feedback comes from that stage's verifier (once, every stage read the
    first stage's task: countdown rows got arithmetic's feedback)."""
    from rlpost.llm.data.prompts import make_prompts
    from rlpost.llm.train.providers.teachers import run_tasks

    cfg = fast_cfg(
        "data.curriculum=[{task: arithmetic, task_params: {digits: 2}, steps: 1}, "
        "{task: countdown, steps: 1}]",
    )
    source = make_prompts(cfg)
    mem = TeacherMemory(MemoryConfig(kind="playbook"), run_tasks(cfg))
    source.set_step(0)
    add = source.next_batch(1)[0]
    source.set_step(1)
    cd = source.next_batch(1)[0]
    wrong = str(int(add.answer) + 10)
    out = mem.observe([add, cd], [wrong, "1+1"], [False, False], step=0)
    assert out[0].meta["reflection"] == f"{wrong}-10"
    cd_task = make_task("countdown")
    assert out[1].meta["reflection"] == cd_task.feedback("1+1", cd) != ""
