"""The household text world (ALFWorld-style) and StepOPSD's hindsight teacher on it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.base import hint_text, play
from rlpost.llm.data.envs.household import KINDS, HouseholdEnv
from rlpost.llm.data.envs.pretrain import demonstration
from rlpost.llm.rollout.agents import env_rollout, group_hindsight
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.fake import ActionScriptEngine


def test_deterministic_under_a_seed_and_every_demonstration_solves():
    a, b = make_env("household"), make_env("household")
    kinds = set()
    for seed in range(300):
        assert a.reset(seed) == b.reset(seed)
        assert a.where == b.where and a.demonstrate() == b.demonstrate()
        kinds.add(a.kind)
        res = play(a, a.demonstrate())
        assert all(r.info["valid"] for r in res)
        assert res[-1].done and res[-1].reward == 1.0 and res[-1].info["solved"]
        # the progress signal adds up to the goal's sub-steps
        per_target = 4 if a.kind in ("heat", "clean") else 3
        assert sum(r.info["gain"] for r in res) == per_target * len(a.targets)
    assert kinds == set(KINDS)


def _episode(kind: str) -> HouseholdEnv:
    env = make_env("household", kinds=[kind], prior=1.0)
    env.reset(3)
    return env


def test_the_verifier_is_exact():
    # heat: putting the object in place without heating it is not the goal
    env = _episode("heat")
    o, r = env.targets[0], env.goal_place
    res = play(env, [str(env.home(o)), f"+{o}", str(r), "="])
    assert not any(x.done for x in res) and not env.solved()
    res = play(env, [f"+{o}", "7", "*", str(r), "="])
    assert res[-1].done and res[-1].reward == 1.0
    # clean needs the sink; heating is not cleaning
    env = _episode("clean")
    o, r = env.targets[0], env.goal_place
    res = play(env, [str(env.home(o)), f"+{o}", "7", "*", str(r), "="])
    assert not env.solved() and [x.info["valid"] for x in res] == [True] * 6
    # picktwo needs both objects in place
    env = _episode("picktwo")
    (o, q), r = env.targets, env.goal_place
    play(env, [str(env.home(o)), f"+{o}", str(r), "="])
    assert not env.solved()
    res = play(env, [str(env.home(q)), f"+{q}", str(r), "="])
    assert res[-1].reward == 1.0
    # the wrong place is not the goal
    env = _episode("pick")
    o, r = env.targets[0], env.goal_place
    wrong = next(p for p in range(1, 7) if p not in (r, env.home(o)))
    play(env, [str(env.home(o)), f"+{o}", str(wrong), "="])
    assert not env.solved()


def test_invalid_actions_change_nothing():
    env = _episode("heat")
    o = env.targets[0]
    before = (dict(env.where), env.held, set(env.hot), env.at)
    for bad in ["*", "=", "+9" if o != 9 else "+8", "9", "0", "x", "12", "-"]:
        res = env.step(bad)
        assert not res.info["valid"] and res.observation == "()>" and res.info["gain"] == 0
    assert (dict(env.where), env.held, set(env.hot), env.at) == before
    with pytest.raises(ValueError, match="kinds"):
        HouseholdEnv(kinds=["fly"])


def test_the_budget_ends_an_episode_unsolved():
    env = make_env("household", kinds=["pick"], budget=2)
    env.reset(0)
    res = play(env, ["1", "2", "3"])
    assert len(res) == 2 and res[-1].done and res[-1].reward == 0.0


def test_hinted_demonstrations_and_group_hindsight():
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    env = make_env("household")
    plain, _ = demonstration(tok, env, 7)
    hinted, labels = demonstration(tok, env, 7, hint=True)
    hint = tok.encode(hint_text(env.demonstrate()), add_special_tokens=False)
    assert hinted == hint + plain and labels[: len(hint)] == [-100] * len(hint)
    # the rollout records each episode's actions as the environment read them
    env.reset(7)
    good = env.demonstrate()
    eng = ActionScriptEngine(tok, [good, good])
    ro = env_rollout(eng, tok, lambda: make_env("household"), [7], 2,
                     SamplingParams(3, 1.0), 20)  # fmt: skip
    assert ro.solved.tolist() == [True, True] and ro.actions == [good, good]
    # the group's shortest solved episode is every member's hint; no success, no hint
    detour = [good[0], "8", *good[1:]]
    fake = SimpleNamespace(
        actions=[detour, good, ["1"] * 6, ["2"] * 6],
        solved=torch.tensor([True, True, False, False]),
    )
    assert group_hindsight(fake, 2) == [hint_text(good)] * 2 + ["", ""]


def test_step_opsd_rescores_with_the_hindsight_context_from_the_cli(fast_overrides, tmp_path):
    """The self-teacher's context reaches StepOPSD's advantage: the policy's own prompt
    gives a gap of exactly 0, a hint before it does not."""
    from rlpost.apps.llm.cli import main as cli

    gaps = {}
    for name, template in (("plain", "{prompt}"), ("hint", "5 +3 1 =:{prompt}")):
        run = tmp_path / name
        over = [
            *fast_overrides, "data.env={name: household, params: {budget: 4}, max_turns: 4}",
            "algo.preset=step_opsd", f"distill.teachers=[{{path: self, template: '{template}'}}]",
            "rollout.max_new_tokens=3", f"run.dir={run}", "train.steps=1",
        ]  # fmt: skip
        assert cli(["train", "--config", "grpo_arithmetic", *over]) == 0
        rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        (row,) = [r for r in rows if r["step"] == 1]
        gaps[name] = row["adv/step_gap_mean"]
        assert "adv/step_factor_spread" in row
    assert abs(gaps["plain"]) < 1e-6 and abs(gaps["hint"]) > 1e-3
