"""Built-in verifiable tasks: sampling, hand-worked scoring, safety of the countdown verifier."""

import json
import pickle
import random

import pytest

from rlpost.llm.data.tasks import (
    CHARSET,
    TASKS,
    ArithmeticTask,
    CountdownTask,
    Example,
    Task,
    extract_answer,
    make_task,
    safe_eval,
)

COUNTDOWN = Example("3 5 7>22:", "3*5+7", {"numbers": [3, 5, 7], "target": 22})
ADD = Example("123+456=", "579", {"a": 123, "b": 456, "op": "+"})


# ----------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("579", "579"),
        ("  579  ", "579"),
        ("579\n123+4=", "579"),
        ("579<eos><pad>", "579"),
        ("\n579", ""),
        ("", ""),
    ],
)
def test_extract_answer_stops_at_newline_or_eos_and_strips(raw, expected):
    assert extract_answer(raw) == expected


# ----------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("579", 1.0),
        (" 579 ", 1.0),
        ("579\n12+3=15", 1.0),  # generation ran on past the answer
        ("579<eos>", 1.0),
        ("579 junk", 1.0),  # trailing junk after the integer is ignored
        ("5790", 0.0),
        ("57", 0.0),
        ("578", 0.0),
        ("", 0.0),
        ("abc", 0.0),
        ("\n579", 0.0),  # the answer is the first line, which is empty
        ("-579", 0.0),
    ],
)
def test_arithmetic_score_hand_worked(completion, reward):
    assert ArithmeticTask().score(completion, ADD) == reward


def test_arithmetic_samples_are_correct_and_in_range():
    rng = random.Random(0)
    task = ArithmeticTask(digits=2, ops="+-*")
    examples = task.sample(500, rng)
    assert len(examples) == 500
    ops = set()
    for ex in examples:
        a, b, op = ex.meta["a"], ex.meta["b"], ex.meta["op"]
        ops.add(op)
        assert 0 <= a <= 99 and 0 <= b <= 99
        assert ex.prompt == f"{a}{op}{b}="
        assert int(ex.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert int(ex.answer) >= 0  # subtraction kept non-negative
        assert task.score(ex.answer, ex) == 1.0
        assert set(ex.prompt + ex.answer) <= set(CHARSET)
        json.dumps(ex.meta)
    assert ops == {"+", "-", "*"}


def test_arithmetic_default_is_three_digit_addition():
    task = ArithmeticTask()
    assert (task.digits, task.ops) == (3, "+")
    examples = task.sample(300, random.Random(1))
    assert all(ex.meta["op"] == "+" and max(ex.meta["a"], ex.meta["b"]) <= 999 for ex in examples)
    assert any(ex.meta["a"] >= 100 for ex in examples)


def test_sampling_is_deterministic_given_the_rng():
    for task in (ArithmeticTask(), CountdownTask()):
        assert task.sample(20, random.Random(7)) == task.sample(20, random.Random(7))


@pytest.mark.parametrize("kwargs", [{"digits": 0}, {"ops": ""}, {"ops": "/"}])
def test_arithmetic_rejects_bad_params(kwargs):
    with pytest.raises(ValueError):
        ArithmeticTask(**kwargs)


# ----------------------------------------------------------------------------- countdown


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("3*5+7", 1.0),
        ("7+5*3", 1.0),  # any order
        ("(3*5)+7", 1.0),  # redundant parentheses
        (" 3 * 5 + 7 \nmore", 1.0),  # whitespace, trailing line
        ("-3*-5+7", 1.0),  # unary minus on a given number
        ("3*5+7+3", 0.0),  # 3 reused
        ("3*5+7+0", 0.0),  # foreign number 0
        ("15+7", 0.0),  # foreign number 15
        ("22", 0.0),  # the target itself is a foreign number
        ("3*5", 0.0),  # valid, wrong value (15)
        ("3*(5+7)", 0.0),  # valid, wrong value (36)
        ("3**5", 0.0),  # power
        ("21/3+5*3", 0.0),  # division
        ("7//1+5*3", 0.0),  # floor division
        ("__import__('os')", 0.0),
        ("__import__('os').system('true')", 0.0),
        ("(lambda: 22)()", 0.0),
        ("3*5+7.0", 0.0),  # float literal
        ("True+21", 0.0),
        ("3*5+7 if 1 else 0", 0.0),
        ("x", 0.0),
        ("", 0.0),
        ("3*5+", 0.0),  # syntax error
        ("3*5+7" + " " * 60, 1.0),  # trailing spaces are stripped before the cap
        ("(" * 40 + "3*5+7" + ")" * 40, 0.0),  # over 64 characters
    ],
)
def test_countdown_score_hand_worked(completion, reward):
    assert CountdownTask().score(completion, COUNTDOWN) == reward


def test_countdown_allows_each_number_at_most_once_as_a_multiset():
    ex = Example("2 2 9>13:", "2+2+9", {"numbers": [2, 2, 9], "target": 13})
    task = CountdownTask()
    assert task.score("2+2+9", ex) == 1.0
    assert task.score("2*2+9", ex) == 1.0
    assert task.score("2+2+2+7", ex) == 0.0  # a third 2 and a foreign 7
    ex2 = Example("4 9 1>13:", "4+9", {"numbers": [4, 9, 1], "target": 13})
    assert task.score("4+9", ex2) == 1.0  # not every number has to be used


def test_safe_eval():
    assert safe_eval("3*(5+7)-2") == (34, [3, 5, 7, 2])
    assert safe_eval("-(4)") == (-4, [4])
    assert safe_eval("1" * 65) is None
    assert safe_eval("2**3") is None
    assert safe_eval("9/3") is None
    assert safe_eval("abs(3)") is None
    assert safe_eval("(1,2)") is None


def test_countdown_samples_score_one_and_use_every_number_once():
    for task in (CountdownTask(), CountdownTask(n_numbers=4, max_number=12)):
        for ex in task.sample(400, random.Random(3)):
            numbers, target = ex.meta["numbers"], ex.meta["target"]
            assert len(numbers) == task.n_numbers
            assert all(1 <= n <= task.max_number for n in numbers)
            assert isinstance(target, int) and target > 0
            assert ex.prompt == " ".join(map(str, numbers)) + f">{target}:"
            value, literals = safe_eval(ex.answer)
            assert value == target and sorted(literals) == sorted(numbers)
            assert task.score(ex.answer, ex) == 1.0
            assert set(ex.prompt + ex.answer) <= set(CHARSET)
            json.dumps(ex.meta)


# ----------------------------------------------------------------------------- registry


def test_make_task_and_registry():
    assert set(TASKS) == {"arithmetic", "countdown", "knapsack", "pde", "chat"}
    task = make_task("arithmetic", digits=2)
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task) and task.digits == 2
    assert task.name == "arithmetic" and task.params() == {"digits": 2, "ops": "+"}
    assert make_task("countdown").name == "countdown"
    with pytest.raises(ValueError, match=r"'sudoku'.*arithmetic, chat, countdown"):
        make_task("sudoku")


def test_tasks_and_scores_pickle():
    for task in (ArithmeticTask(digits=2), CountdownTask()):
        ex = task.sample(1, random.Random(0))[0]
        task2, ex2 = pickle.loads(pickle.dumps((task, ex)))
        assert task2 == task and ex2 == ex
        assert task2.score(ex.answer, ex2) == 1.0
        assert pickle.loads(pickle.dumps(task.score))(ex.answer, ex) == 1.0


def test_knapsack_scores_raw_values_without_reading_the_answer():
    from rlpost.llm.data.tasks import KnapsackTask

    task = make_task("knapsack")
    assert isinstance(task, KnapsackTask)
    exs = task.sample(200, random.Random(0))
    assert {e.meta["scale"] for e in exs} == {1, 10, 100}  # instance score ranges differ
    e = Example("2*3 3*40 4*5(5)>", "01", {"w": [2, 3, 4], "v": [3, 40, 5], "cap": 5})
    assert task.score("01", e) == 43.0 and task.score("1", e) == 40.0
    assert task.score("12", e) == 0.0  # over capacity
    assert task.score("11", e) == 0.0 and task.score("7", e) == 0.0 and task.score("x", e) == 0.0
    blind = Example(e.prompt, "", e.meta)  # no reference answer: the same scores
    assert task.score("01", blind) == 43.0
    assert task.accuracy("01", blind) == 1.0 and task.accuracy("1", blind) == 0.0
    for ex in exs[:50]:  # the logged best subset is feasible and no subset beats it
        best = task.score(ex.answer, ex)
        n = len(ex.meta["w"])
        for c in range(1 << n):
            pick = "".join(str(i) for i in range(n) if c >> i & 1)
            assert task.score(pick, ex) <= best
