"""The knowledge-graph reasoning environment (catalog 000-04)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.kg import FAMILIES, parse, solve


def test_deterministic_unique_and_exactly_verified():
    a, b = make_env("kg"), make_env("kg")
    seen = Counter()
    for seed in range(300):
        prompt = a.reset(seed)
        assert prompt == b.reset(seed) and a.family == b.family
        seen[a.family] += 1
        assert solve(prompt, a.family) == [a.answer_value]  # one answer, the env's
        wrong = str((a.answer_value + 1) % 10)
        assert a.step(wrong).reward == 0.0
        res = a.step(a.ground_truth())
        assert res.done and res.reward == 1.0 and res.info["family"] == a.family
    assert set(seen) == set(FAMILIES) and min(seen.values()) > 50


def test_hand_checked_instances_of_each_family():
    # deductive: 3 -+-> 5 -*-> 7
    assert solve("3+5 5*7 5+1 3*2:3+*>", "deductive") == [7]
    # abductive: 3+x is hidden, x*7 is shown for x = 4 only
    assert solve("4*7 4+3 1*2:3+(*)7>", "abductive") == [4]
    assert solve("4*7 9*7:3+(*)7>", "abductive") == [4, 9]  # not unique: never generated
    # inductive: + adds 3 mod 10
    assert solve("1+4 2+5 8+1 5*5:6+>", "inductive") == [9]
    # analogical: 3 is to 5 by *, so 6 is to what 6* is
    assert solve("3*5 6*0 6+2:3=5(6)>", "analogical") == [0]


def test_depth_and_complexity_shape_the_instances():
    for depth in (1, 2, 3):
        for complexity in (0, 4):
            env = make_env("kg", depth=depth, complexity=complexity, families=["deductive"])
            for seed in range(20):
                facts, q = parse(env.reset(seed))
                assert len(q) == 1 + depth and len(facts) == depth + complexity
    with pytest.raises(ValueError, match="depth"):
        make_env("kg", depth=4)
    with pytest.raises(ValueError, match="families"):
        make_env("kg", families=["magic"])


def test_a_region_of_the_grid_draws_each_instance_cell_from_it():
    env = make_env("kg", depth=[1, 3], complexity=[0, 5], families=["deductive"])
    cells = set()
    for seed in range(60):
        facts, q = parse(env.reset(seed))
        depth, complexity = len(q) - 1, len(facts) - (len(q) - 1)
        assert depth in (1, 3) and complexity in (0, 5)
        info = env.step(env.ground_truth()).info
        assert (info["depth"], info["complexity"]) == (depth, complexity) and info["solved"]
        cells.add((depth, complexity))
    assert cells == {(1, 0), (1, 5), (3, 0), (3, 5)}
    # a single level draws nothing: a fixed cell is what it always was
    assert make_env("kg", depth=[2]).reset(7) == make_env("kg", depth=2).reset(7)
    again = make_env("kg", depth=[1, 3], complexity=[0, 5], families=["deductive"])
    assert again.reset(11) == env.reset(11)
    for bad in ([], [0, 2], [1.5]):
        with pytest.raises(ValueError, match=r"depth must be in 1\.\.3"):
            make_env("kg", depth=bad)


def test_a_policy_trains_on_the_graph_from_the_cli(fast_overrides, tmp_path):
    from rlpost.apps.llm.cli import main as cli

    run = tmp_path / "kg"
    over = [*fast_overrides, "data.env={name: kg, max_turns: 1}", "rollout.max_new_tokens=3",
            f"run.dir={run}", "train.steps=1"]  # fmt: skip
    assert cli(["train", "--config", "grpo_arithmetic", *over]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1]
