import json

import pytest

from rlpost.llm.data.prompts import make_prompt_source
from rlpost.llm.rollout.rewards import math_verify_reward


def _write_jsonl(path, n):
    path.write_text(
        "".join(
            json.dumps({"prompt": f"{i}/2=", "answer": f"{i / 2}", "id": i}) + "\n"
            for i in range(n)
        )
    )


def test_file_source_holds_out_the_tail_and_cycles_epochs(tmp_path):
    f = tmp_path / "d.jsonl"
    _write_jsonl(f, 10)
    src = make_prompt_source("arithmetic", {}, str(f), eval_size=3, seed=0)
    assert [e.meta["id"] for e in src.eval_examples] == [7, 8, 9]
    first = src.next_batch(7)
    assert sorted(e.meta["id"] for e in first) == list(range(7))  # one epoch = every row once
    second = src.next_batch(7)
    assert sorted(e.meta["id"] for e in second) == list(range(7))
    assert [e.meta["id"] for e in first] != [e.meta["id"] for e in second]  # reshuffled


def test_file_source_position_resumes_exactly(tmp_path):
    f = tmp_path / "d.jsonl"
    _write_jsonl(f, 20)
    a = make_prompt_source("arithmetic", {}, str(f), eval_size=2, seed=3)
    a.next_batch(11)
    state = json.loads(json.dumps(a.state_dict()))  # survives JSON, as in checkpoints
    b = make_prompt_source("arithmetic", {}, str(f), eval_size=2, seed=3)
    b.load_state_dict(state)
    assert [e.prompt for e in a.next_batch(15)] == [e.prompt for e in b.next_batch(15)]


def test_task_source_resumes_exactly():
    a = make_prompt_source("countdown", {}, None, eval_size=4, seed=1)
    a.next_batch(5)
    b = make_prompt_source("countdown", {}, None, eval_size=4, seed=1)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [e.prompt for e in a.next_batch(6)] == [e.prompt for e in b.next_batch(6)]


def test_file_source_errors_name_the_problem(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"no 'prompt' column; found \['question', 'answer'\]"):
        make_prompt_source("arithmetic", {}, str(f), eval_size=1, seed=0)
    _write_jsonl(f, 1)
    with pytest.raises(ValueError, match=r"1 row\(s\); need at least 2"):
        make_prompt_source("arithmetic", {}, str(f), eval_size=5, seed=0)
    _write_jsonl(f, 3)  # fewer rows than data.eval_size: a tenth (at least one) held out
    src = make_prompt_source("arithmetic", {}, str(f), eval_size=5, seed=0)
    assert len(src.examples) == 2 and len(src.eval_examples) == 1


def test_file_rows_are_scored_with_math_verify(tmp_path):
    f = tmp_path / "d.jsonl"
    _write_jsonl(f, 4)
    ex = make_prompt_source("arithmetic", {}, str(f), eval_size=1, seed=0).eval_examples[
        0
    ]  # 3/2 = 1.5
    assert math_verify_reward("1.5", ex) == 1.0 and math_verify_reward("$\\frac{3}{2}$", ex) == 1.0
    assert math_verify_reward("2", ex) == 0.0
