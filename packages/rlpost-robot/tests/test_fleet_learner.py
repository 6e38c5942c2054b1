"""The fleet learner's accounting: each store episode once (accepted or stale), the
staleness bound, and a restart from its checkpoint and the store (no Ray needed), for
every algorithm the fleet runs (each registered ``Algorithm.fleet``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlpost.robot.algos import ALGORITHMS
from rlpost.robot.fleet.learner import FleetLearner
from rlpost.robot.fleet.store import ExperienceStore
from rlpost.robot.pretrain import build_bc_policy, build_demo_dataset, load_demos

sys.path.insert(0, str(Path(__file__).parent))
from test_fleet_store import TASK, episode

SMALL = {"batch_size": 16, "hidden": 32, "sample_steps": 3}
PARAMS = {  # small and quick; a newly registered fleet algorithm runs with its defaults
    "lwd": {**SMALL, "offline_steps": 3, "atoms": 11},
    "otql": {**SMALL, "critic_pretrain_steps": 3, "k_samples": 4},
}
FLEET = [n for n in ALGORITHMS if ALGORITHMS.get(n).fleet is not None]


def test_the_fleet_runs_every_flow_algorithm_with_a_fleet_learner():
    assert {"lwd", "otql"} <= set(FLEET)
    for name in FLEET:
        assert ALGORITHMS.get(name).policy_kind == "flow", name  # what the robots act with


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    demos = {"n_good": 2, "n_poor": 2}
    folder = build_bc_policy(TASK, cache, progress=False, demos=demos, steps=20, hidden=32)
    return str(folder), load_demos(build_demo_dataset(TASK, cache, **demos))


def learner(base, tmp_path, algo, **kw) -> FleetLearner:
    folder, demos = base
    kw = {"updates_per_version": 2, "save_every": 1, **kw}
    params = PARAMS.get(algo, {})
    store = str(tmp_path / "store")
    return FleetLearner(folder, demos, params, str(tmp_path), store, algo=algo, **kw)


@pytest.mark.parametrize("algo", FLEET)
def test_each_episode_is_accounted_once_and_stale_ones_are_not_trained(base, tmp_path, algo):
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    ln = learner(base, tmp_path, algo, max_staleness=2)
    for _ in range(5):
        ln.step()
    assert ln.version == 5
    eps = [episode(i) for i in range(4)]
    for e, v in zip(eps, (5, 3, 2, 0), strict=True):  # 0, 2, 3 and 5 versions behind
        e.policy_version = v
    got = [ln.ingest(store.append(e), e) for e in eps]
    assert got == ["accepted", "accepted", "stale", "stale"]  # bound: at most 2 behind
    assert ln.learner.online_size() == sum(len(e) for e in eps[:2])  # one chunk per step
    assert ln.ingest(1, eps[1]) == "duplicate" and ln.duplicates == 1
    with pytest.raises(ValueError, match="arrived before 4"):
        ln.ingest(6, eps[0])
    acc = ln.accounting()
    assert acc == {"accepted": [0, 1], "stale": [2, 3]}


@pytest.mark.parametrize("algo", FLEET)
def test_a_restarted_learner_resumes_from_its_checkpoint_and_the_store(base, tmp_path, algo):
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    a = learner(base, tmp_path, algo, max_staleness=100)
    eps = [episode(i) for i in range(10)]
    for e in eps[:6]:
        a.ingest(store.append(e), e)
    a.step()  # version 1, checkpointed (save_every=1) with watermark 6
    for e in eps[6:]:  # recorded in the store, seen by the learner, then it dies
        a.ingest(store.append(e), e)
    a.step()
    a.step()
    version = a.version  # 3, checkpointed with watermark 10
    del a  # the learner process is gone
    b = learner(base, tmp_path, algo, resume=True, min_version=version + 1, max_staleness=100)
    assert b.resumed_from is not None and b.resumed_from.endswith("step-000003")
    assert b.watermark == 10 and b.version == version + 1
    # a checkpoint taken after every episode was seen: the replay rebuilt from the store
    # equals the one the dead learner had
    assert b.learner.online_size() == sum(len(e) for e in eps)
    # re-sending everything (what a coordinator does after a restart) changes nothing
    assert [b.ingest(i, e) for i, e in enumerate(eps)] == ["duplicate"] * 10
    assert sorted(b.accounting()["accepted"]) == list(range(10))


@pytest.mark.parametrize("algo", FLEET)
def test_a_learner_killed_before_its_checkpoint_gets_the_rest_from_the_store(base, tmp_path, algo):
    """Killed after seeing episodes 6..9 but before checkpointing them: the restarted
    learner has the checkpoint's replay (rebuilt from the store), its watermark 6, and
    takes 6..9 again, each once."""
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    a = learner(base, tmp_path, algo, max_staleness=100, save_every=100)
    eps = [episode(i) for i in range(10)]
    for e in eps[:6]:
        a.ingest(store.append(e), e)
    a.save()  # the last checkpoint: watermark 6
    replay = {k: v.clone() for k, v in a.learner.export_state().tensors.items()}
    weights = {k: v.clone() for k, v in a.learner.policy.state_dict().items()}
    for e in eps[6:]:
        a.ingest(store.append(e), e)
    a.step()  # trained on them, never checkpointed
    del a
    b = learner(base, tmp_path, algo, resume=True, min_version=5, max_staleness=100, save_every=100)
    assert b.watermark == 6 and b.accounting()["accepted"] == list(range(6))
    got = b.learner.export_state().tensors  # the whole replay, demonstrations and online
    assert got.keys() == replay.keys()
    for k, v in got.items():
        assert torch.equal(v, replay[k]), k
    for k, v in b.learner.policy.state_dict().items():
        assert torch.equal(v, weights[k]), k
    sent = [b.ingest(i, e) for i, e in enumerate(eps)]
    assert sent == ["duplicate"] * 6 + ["accepted"] * 4
    acc = b.accounting()["accepted"]
    assert acc == list(range(10)) and len(set(acc)) == len(acc)
    assert b.version == 5  # versions only grow past what the dead learner published


@pytest.mark.parametrize("algo", FLEET)
def test_a_learner_resumes_after_the_store_quarantined_episodes_it_had_seen(base, tmp_path, algo):
    """The store's last episode file is truncated after the learner checkpointed it: the
    store's recovery quarantines it. Before, the learner's restore failed with
    ``IndexError: store has 11 episodes, no episode 11``, at every later --resume."""
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    a = learner(base, tmp_path, algo, max_staleness=100)
    eps = [episode(i) for i in range(6)]
    for e in eps:
        a.ingest(store.append(e), e)
    a.step()  # checkpointed with watermark 6, accepted 0..5
    del a
    last = store.path(5)
    last.write_bytes(last.read_bytes()[:40])  # torn
    store, rec = ExperienceStore.open(tmp_path / "store", TASK)
    assert len(store) == 5 and rec.quarantined
    b = learner(base, tmp_path, algo, resume=True, min_version=2, max_staleness=100)
    assert b.watermark == 5 and b.accounting()["accepted"] == list(range(5))
    assert b.learner.online_size() == sum(len(e) for e in eps[:5])
    # the next episode the store records takes index 5 and is accepted, once
    e = episode(6)
    assert b.ingest(store.append(e), e) == "accepted" and b.watermark == 6
