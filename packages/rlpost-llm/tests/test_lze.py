"""LZE (000-18): the energy score by hand, the backward selector's share, the forward
pruner's pruning and replay, and the pool's state across a resume."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.core.selection import anchor_pass_rate, ema, energy, pruner_step, select_top
from rlpost.llm.config import load_config
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.rollout.sources.lze import LZE, LZESource, Pool
from rlpost.llm.trainer import Trainer


def test_the_energy_score_matches_hand_worked_values():
    p0 = anchor_pass_rate(torch.tensor([math.log(0.25), 0.0, -200.0]))
    assert torch.allclose(p0, torch.tensor([0.25, 1 - 1e-6, 1e-6]))  # clamped both ends
    p = ema(torch.tensor([0.25, 0.5]), torch.tensor([0.75, 0.1]), beta=0.5)
    assert torch.allclose(p, torch.tensor([0.5, 0.3]))
    # rising 0.25 -> 0.5: 4 (.5)(.5)(1 + 2 x .25) = 1.5; falling 0.5 -> 0.3: 4 (.3)(.7) = .84
    e = energy(p, torch.tensor([0.25, 0.5]), alpha=2.0)
    assert torch.allclose(e, torch.tensor([1.5, 0.84]))
    assert energy(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]), 1.0).tolist() == [0, 0]


def test_the_selector_keeps_the_top_energies_and_samples_in_proportion_with_noise():
    e = torch.tensor([0.1, 0.9, 0.5, 0.9, 0.0])
    assert select_top(e, 2, 0.0, None).tolist() == [1, 3]
    assert select_top(e, 3, 0.0, None).tolist() == [1, 2, 3]
    gen = torch.Generator().manual_seed(0)
    picks = [select_top(torch.tensor([1.0, 3.0]), 1, 1.0, gen).item() for _ in range(4000)]
    assert abs(sum(picks) / 4000 - 0.75) < 0.03  # tau 1: drawn in proportion to energy


def test_the_pruner_prunes_after_patience_and_restores_a_forgotten_replay():
    streak, pruned = torch.tensor([0, 1, 1, 3]), torch.tensor([False, False, False, True])
    solved = torch.tensor([True, True, False, False])
    s, p, r = pruner_step(streak, pruned, solved, patience=2)
    assert s.tolist() == [1, 2, 0, 0]
    assert p.tolist() == [False, True, False, False]  # the 4th, replayed and failed: back
    assert r.tolist() == [False, False, False, True]


def _pool(n=8, **kw):
    pool = Pool([Example(str(i), str(i)) for i in range(n)], LZE(**kw), seed=0)
    pool.set_anchor(torch.full((n,), 0.5))
    return pool


def test_the_pruned_share_and_the_replay_follow_the_configuration():
    pool = _pool(patience=1, replay=0.5)
    idx, replays = pool.next_indices(8)  # epoch 0: every prompt once
    assert sorted(idx) == list(range(8)) and replays == 0
    solved = torch.tensor([i < 4 for i in idx])  # the first four visited are solved
    pool.observe(torch.tensor(idx), solved.float(), solved)
    assert pool.pruned.sum() == 4
    idx2, replays = pool.next_indices(6)  # epoch 1: 4 active + half of 4 pruned replayed
    assert len(pool.order) == 6 and replays == 2 and pool.replayed == 2
    replayed = [i for i in idx2 if pool.pruned[i]]
    ok = torch.tensor([i == replayed[1] for i in idx2])  # one replay solved, one not
    _, restored = pool.observe(torch.tensor(idx2), ok.float(), ok)
    assert restored.sum() == 1 and pool.pruned.sum() == 3
    assert not pool.pruned[replayed[0]] and pool.pruned[replayed[1]]


def test_a_fully_pruned_pool_still_replays_one_prompt():
    pool = _pool(n=4, patience=1, replay=0.0)
    idx, _ = pool.next_indices(4)
    pool.observe(torch.tensor(idx), torch.ones(4), torch.ones(4, dtype=torch.bool))
    idx2, replays = pool.next_indices(2)
    assert replays == 2 and len(pool.order) == 1 and all(pool.pruned[i] for i in idx2)


def _digit_one(completion: str, example) -> float:
    return float(completion.startswith("1"))


def test_a_step_trains_on_the_highest_energy_share_of_its_groups(fast_cfg):
    cfg = fast_cfg("algo.lze={keep: 0.5, tau: 0.0, pool: 16}", "rollout.prompts_per_step=8")
    tr = Trainer(cfg, reward_fn=_digit_one)
    src = next(s for s in tr.rollouts.chain() if isinstance(s, LZESource))
    assert len(src.pool.examples) == 16
    one, two = (tr.tok.convert_tokens_to_ids(c) for c in ("1", "2"))
    eos = tr.tok.eos_token_id
    calls = iter(range(10**6))

    def script(p, n):  # prompt k of the step: k % 4 of its 4 samples start with "1"
        k = next(calls) % 8
        return [([one if j < k % 4 else two, eos], [-1.0, -1.0], "stop") for j in range(n)]

    tr.engine = FakeEngine(script)
    col = tr.rollouts.collect()
    m = col.metrics
    assert m["lze/kept"] == 4 and m["rollouts/generated"] == 32 and col.n_groups() == 4
    acc = col.accuracy.view(4, 4).mean(1)
    assert all(0 < a < 1 for a in acc.tolist())  # the solved-sometimes groups are kept
    assert m["lze/energy_kept"] > m["lze/energy_dropped"]
    tr.close()


def test_the_pool_resumes_exactly(fast_cfg, tmp_path):
    over = ("algo.lze={keep: 0.5, pool: 12, patience: 1}", "run.save_every=2")
    straight = Trainer(fast_cfg(*over, "train.steps=4", f"run.dir={tmp_path / 'a'}"))
    straight.train()
    Trainer(fast_cfg(*over, "train.steps=2", f"run.dir={tmp_path / 'b'}")).train()
    resumed = Trainer(fast_cfg(*over, "train.steps=4", f"run.dir={tmp_path / 'b'}"), resume=True)
    resumed.train()
    a, b = (next(s for s in t.rollouts.chain() if isinstance(s, LZESource)).pool
            for t in (straight, resumed))  # fmt: skip
    assert a.visits.sum() == 4 * 4 and a.epoch == b.epoch and a.order == b.order
    for key in ("anchor", "p", "streak", "pruned", "visits"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    pairs = zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True)
    for (n, x), (_, y) in pairs:
        assert torch.equal(x, y), n
    straight.close()
    resumed.close()


def test_lze_loads_from_the_cli_config_and_refuses_bad_settings(fast_overrides):
    cfg = load_config(None, [*fast_overrides, "algo.lze={}"])
    assert any(c.name == "lze" for c in cfg.preset().rollout)
    with pytest.raises(ValueError, match="keep must be in"):
        load_config(None, [*fast_overrides, "algo.lze={keep: 0}"])
    with pytest.raises(ValueError, match="LZE"):
        load_config(None, [*fast_overrides, "algo.lze={}", "algo.dynamic_sampling=true"])
