"""Multi-turn agents (issue 20): the text-environment protocol, the rewrite environment's
exact audit (004-13), and token-in / token-out rollouts: the tokens trained on are exactly
the tokens sampled, observations are masked out, every token knows its turn."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from rlpost.llm.config import ConfigError
from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.rewrite import audit
from rlpost.llm.rollout.agents import env_rollout
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.fake import ActionScriptEngine


def _all_rewrites(old: str) -> set[str]:
    """Every string reachable in one step, by enumerating every cut of ``old`` into runs."""
    out = set()
    n = len(old)
    for cuts in itertools.product([0, 1], repeat=n - 1):
        runs, start = [], 0
        for i, c in enumerate(cuts, 1):
            if c:
                runs.append(old[start:i])
                start = i
        runs.append(old[start:])
        if len(runs) < n:
            out.add("".join(str(sum(map(int, r)) % 10) for r in runs))
    return out


def test_the_audit_accepts_exactly_the_one_step_rewrites():
    for old in ["3142", "909", "5555", "1203"]:
        valid = _all_rewrites(old)
        for m in range(1, len(old)):
            for cand in map("".join, itertools.product("0123456789", repeat=m)):
                assert (audit(old, cand) is not None) == (cand in valid), (old, cand)
    assert audit("3142", "3142") is None  # contracting nothing is not a step
    assert audit("3142", "4x") is None and audit("3142", "") is None
    assert audit("3142", "0") == [4]  # the whole string at once: a sequential composition


def test_the_environment_is_deterministic_and_its_reward_exact():
    env, again = (
        make_env("rewrite", min_len=4, max_len=4),
        make_env("rewrite", min_len=4, max_len=4),
    )
    assert env.reset(7) == again.reset(7) and env.reset(7) != env.reset(8)
    obs = env.reset(7)
    s = obs[:-1]
    res = env.step("x")  # invalid: the state stays, the audit says so
    assert not res.info["valid"] and res.observation == f"(){s}>" and not res.done
    env.reset(7)
    r1 = env.step(str((int(s[0]) + int(s[1])) % 10) + s[2:])  # a primitive contraction
    assert r1.info["valid"] and r1.info["primitive"] == 1 and r1.observation == ">"
    r2 = env.step(env.answer())  # then everything at once: solved, reward 1
    assert r2.done and r2.reward == 1.0 and r2.info["solved"]
    env.reset(7)
    for _ in range(3):  # the budget (length - 1 turns) runs out unsolved: reward 0
        last = env.step("x")
    assert last.done and last.reward == 0.0 and not last.info["solved"]
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("nope")


def test_rollouts_are_token_in_token_out_with_observations_masked():
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    env = make_env("rewrite", min_len=4, max_len=4)
    s = env.reset(11)[:-1]
    step1 = str((int(s[0]) + int(s[1])) % 10) + s[2:]
    # episode 0: a primitive step then the answer; episode 1: an invalid step, then solved
    eng = ActionScriptEngine(tok, [[step1, env.answer()], ["99", env.answer()]])
    sp = SamplingParams(6, 1.0)
    ro = env_rollout(eng, tok, lambda: make_env("rewrite", min_len=4, max_len=4), [11], 2, sp, 4)
    b = ro.batch
    assert ro.solved.tolist() == [True, True] and ro.rewards.tolist() == [1.0, 1.0]
    assert ro.turns.tolist() == [2, 2]
    for i, first in enumerate([step1, "99"]):
        ids = b.completion_ids[i].tolist()
        a1 = [*tok.encode(first, add_special_tokens=False), tok.eos_token_id]
        obs = tok.encode(">" if i == 0 else f"(){s}>", add_special_tokens=False)
        a2 = [*tok.encode(env.answer(), add_special_tokens=False), tok.eos_token_id]
        want = a1 + obs + a2
        assert ids[: len(want)] == want  # exactly the sampled ids, in order
        m = b.mask[i, : len(want)].tolist()
        assert m == [1.0] * len(a1) + [0.0] * len(obs) + [1.0] * len(a2)  # obs: no loss
        t = ro.turn_ids[i, : len(want)].tolist()
        assert t == [0] * len(a1) + [-1] * len(obs) + [1] * len(a2)
        lp = b.logprobs[i, : len(want)]
        assert torch.allclose(lp[: len(a1)], torch.tensor([-0.1 * (j + 1) for j in range(len(a1))]))
        assert (lp[len(a1) : len(a1) + len(obs)] == 0).all()
    # turn 2 generated from the whole sequence so far, as ids (nothing re-tokenised):
    # episode 0's prompt, its first action with EOS, and the observation ">"
    first = len(tok.encode(step1, add_special_tokens=False)) + 2
    assert eng.calls[1][0] == b.prompt_ids[0] + b.completion_ids[0, :first].tolist()


def test_a_policy_trains_on_episodes_from_the_cli(fast_overrides, tmp_path):
    from rlpost.apps.llm.cli import main as cli

    run = tmp_path / "env"
    over = [
        *fast_overrides, "data.env={name: rewrite, params: {min_len: 3, max_len: 4}, max_turns: 3}",
        "rollout.max_new_tokens=5", "run.eval_every=2", "data.eval_size=4", f"run.dir={run}",
        "run.save_every=1",
    ]  # fmt: skip
    assert cli(["train", "--config", "grpo_arithmetic", *over]) == 0
    rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in trained] == [1, 2]
    assert all("env/turns" in r and 1 <= r["env/turns"] <= 3 for r in trained)
    # the training forward sees each action in its sampling context (observations
    # attended, not trained on): its log-probs of the sampled tokens are the engine's
    assert all(r["mismatch/abs_max"] < 1e-3 for r in trained)
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    # resume continues the episode seeds where they were
    assert cli(["train", "--config", "grpo_arithmetic", *over, "train.steps=3", "--resume"]) == 0
    ck = sorted((Path(run) / "checkpoints").iterdir())[-1]
    assert json.loads((ck / "state.json").read_text())["env_next"] == 3 * 4


def test_env_config_errors_name_the_problem(fast_cfg):
    with pytest.raises(ConfigError, match="unknown environment 'nope'"):
        fast_cfg("data.env={name: nope}")
    with pytest.raises(ConfigError, match=r"data\.env\.params"):
        fast_cfg("data.env={name: rewrite, params: {colour: 3}}")
    with pytest.raises(ConfigError, match="dynamic sampling"):
        fast_cfg("data.env={name: rewrite}", "algo.preset=dapo")


class SlowEnv:
    """A one-turn environment whose step takes 0.2 s (a slow tool)."""

    name = "slow"
    spans: ClassVar[list[tuple[float, float]]] = []  # (start, end) of every step taken

    def reset(self, seed: int) -> str:
        return "1>"

    def step(self, action: str):
        import time

        from rlpost.llm.data.envs.base import StepResult

        t0 = time.monotonic()
        time.sleep(0.2)
        SlowEnv.spans.append((t0, time.monotonic()))
        return StepResult("", 1.0, True, {"solved": True})


def test_slow_environments_step_concurrently():
    """Measured by overlap, not by wall-clock time (which a loaded machine stretches)."""
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    eng = ActionScriptEngine(tok, [["1"]] * 8)
    SlowEnv.spans = []
    ro = env_rollout(eng, tok, SlowEnv, [0, 1], 4, SamplingParams(4, 1.0), 2, workers=8)
    assert ro.solved.all() and len(SlowEnv.spans) == 8
    # the most steps in flight at one moment (one by one, it would be 1)
    most = max(sum(a <= t < b for a, b in SlowEnv.spans) for t, _ in SlowEnv.spans)
    assert most >= 4


def test_the_environment_base_is_trained_on_the_rollout_layout(tmp_path):
    """A demonstration is laid out exactly as a rollout of the same actions (the base is
    pretrained on what it will see), with labels on the actions and their EOS only; the
    base builds, caches, and records its held-out success."""
    from rlpost.llm.data.envs.pretrain import build_env_base, demonstration
    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    env = make_env("rewrite", min_len=4, max_len=4)
    ids, labels = demonstration(tok, env, 5)
    env.reset(5)
    eng = ActionScriptEngine(tok, [env.demonstrate()])
    ro = env_rollout(eng, tok, lambda: make_env("rewrite", min_len=4, max_len=4), [5], 1,
                     SamplingParams(6, 1.0), 4)  # fmt: skip
    b = ro.batch
    n = len(b.prompt_ids[0])
    assert ids == b.prompt_ids[0] + b.completion_ids[0, : len(ids) - n].tolist()
    trained = [x != -100 for x in labels[n:]]
    assert trained == (b.mask[0, : len(ids) - n] > 0).tolist()
    path = build_env_base("rewrite", {"min_len": 3, "max_len": 4, "budget": 2}, steps=3,
                          cache_dir=tmp_path, progress=False)  # fmt: skip
    info = json.loads((path / "base_info.json").read_text())
    assert 0.0 <= info["heldout_success"] <= 1.0 and "budget" not in info["params"]
    again = build_env_base("rewrite", {"min_len": 3, "max_len": 4}, steps=3, cache_dir=tmp_path)
    assert again == path  # the budget is not part of the base
