"""Pilot-Commit (000-05): the pilot's variance decides where the rest of the budget goes;
a collapsed prompt gets nothing; committed groups hold their pilot rollouts."""

from __future__ import annotations

import pytest
import torch

from rlpost.llm.config import load_config
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.rollout.sources.pilot_commit import PilotCommit, allocate
from rlpost.llm.trainer import Trainer


def test_allocation_follows_the_pilot_variance_and_skips_collapsed_prompts():
    pilot = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.5, 0.7]])
    assert allocate(pilot, 2).tolist() == [1, 3]  # variance 0.25 twice, in order
    assert allocate(pilot, 3).tolist() == [1, 3, 4]  # then the small one
    assert allocate(pilot, 10).tolist() == [1, 3, 4]  # never 0 or 2 (all equal)
    assert allocate(torch.ones(4, 3), 4).tolist() == []


def test_the_budget_is_rollouts_split_between_pilot_and_commit():
    assert PilotCommit().plan(256, 8) == (64, 21)  # 128 pilot rollouts, 126 committed
    assert PilotCommit(fraction=0.25, samples=4).plan(256, 8) == (16, 48)
    with pytest.raises(ValueError, match="must exceed the pilot's samples"):
        PilotCommit(samples=4).plan(256, 4)
    with pytest.raises(ValueError, match="a variance needs two"):
        PilotCommit(samples=1)


def _odd_answers_vary(completion: str, example) -> float:
    """Even answers: every completion scores 1 (collapsed); odd: those starting with 1."""
    return 1.0 if int(example.answer) % 2 == 0 else float(completion.startswith("1"))


def test_a_step_commits_only_the_varied_prompts_with_their_pilot_rows(fast_cfg):
    cfg = fast_cfg("algo.pilot_commit={fraction: 0.5, samples: 2}", "rollout.group_size=4",
                   "rollout.prompts_per_step=8")  # fmt: skip
    tr = Trainer(cfg, reward_fn=_odd_answers_vary)
    one, two = (tr.tok.convert_tokens_to_ids(c) for c in ("1", "2"))
    eos = tr.tok.eos_token_id
    calls = []

    def script(p, n):  # alternate "1" / "2": odd-answer prompts get varied pilots
        calls.append(n)
        return [([one if i % 2 == 0 else two, eos], [-1.0, -1.0], "stop") for i in range(n)]

    tr.engine = FakeEngine(script)
    col = tr.rollouts.collect()
    m = col.metrics
    budget, (n_cand, n_commit) = 8 * 4, PilotCommit().plan(8 * 4, 4)
    assert m["pilot/candidates"] == n_cand == 8
    assert all(int(e.answer) % 2 for e in col.examples)  # only the varied (odd) prompts
    g = col.batch.group
    groups = int(g.max()) + 1
    assert 0 < groups == m["pilot/committed"] <= n_commit
    assert 0 < m["pilot/collapsed_frac"] < 1 and m["pilot/var_skipped"] < m["pilot/var_committed"]
    assert m["rollouts/generated"] == n_cand * 2 + groups * 2 <= budget
    assert torch.equal(torch.bincount(g), torch.full((groups,), 4))
    for j in range(groups):  # a group: one prompt (its 2 pilot rows and 2 committed ones)
        rows = torch.nonzero(g == j).flatten().tolist()
        assert len({tuple(col.batch.prompt_ids[r]) for r in rows}) == 1
    assert calls[0] == 2 and all(c == 2 for c in calls[1:])  # pilot k, then group - k


def test_pilot_commit_trains_from_the_cli_config_and_refuses_small_groups(fast_overrides):
    with pytest.raises(ValueError, match="must exceed the pilot's samples"):
        load_config(None, [*fast_overrides, "algo.pilot_commit={samples: 4}"])
    cfg = load_config(None, [*fast_overrides, "algo.pilot_commit={}"])
    assert any(c.name == "pilot_commit" for c in cfg.preset().rollout)


@pytest.mark.parametrize(
    "other", ["algo.dynamic_sampling=true", "train.pipeline=dora", "train.pipeline=rolloutpipe"]
)
def test_what_cannot_wrap_the_pilot_and_commit_rounds_is_refused_at_load(fast_overrides, other):
    with pytest.raises(ValueError, match="Pilot-Commit"):
        load_config(None, [*fast_overrides, "algo.pilot_commit={}", other])
