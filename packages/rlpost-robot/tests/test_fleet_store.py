"""The fleet's experience store: whole episodes or none, recovery to the last whole
episode after a kill or a truncated file, a LeRobotDataset that lerobot opens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rlpost.robot.demos import Episode
from rlpost.robot.fleet.store import ExperienceStore
from rlpost.robot.lerobot_data import load_lerobot_dataset

TASK = "multimodal_reach"


def episode(i: int, length: int = 7) -> Episode:
    """A fleet episode whose content says which one it is."""
    rng = np.random.default_rng(i)
    human = np.zeros(length, bool)
    human[2:4] = i % 2 == 0
    success = i % 3 == 0
    rewards = np.zeros(length, np.float32)
    rewards[-1] = float(success)
    return Episode(
        obs=rng.normal(size=(length + 1, 8)).astype(np.float32) + i,
        actions=rng.uniform(-1, 1, size=(length, 2)).astype(np.float32),
        rewards=rewards,
        success=success,
        metrics={"return": float(success), "length": length},
        terminated=success,
        step_success=np.arange(length) == length - 1 if success else np.zeros(length, bool),
        task=TASK,
        seed=1000 + i,
        intervention=human,
        policy_version=i // 2,
        robot=i % 3,
        episode_id=100 + i,
    )


def same(a: Episode, b: Episode) -> None:
    for k in ("obs", "actions", "rewards", "intervention"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    for k in ("success", "terminated", "policy_version", "robot", "episode_id"):
        assert getattr(a, k) == getattr(b, k), k


def test_episodes_round_trip_through_the_spool_and_the_lerobot_dataset(tmp_path):
    store, rec = ExperienceStore.open(tmp_path / "store", TASK)
    assert rec.clean and len(store) == 0
    eps = [episode(i, 5 + i % 4) for i in range(6)]
    assert [store.append(e) for e in eps[:4]] == [0, 1, 2, 3]
    assert store.build_view() == 4
    assert [store.append(e) for e in eps[4:]] == [4, 5]
    assert store.build_view() == 2  # appended to a clone, switched in
    for a, b in zip(eps, store.read(), strict=True):
        same(a, b)
    assert store.episode_ids() == [100 + i for i in range(6)]
    back = load_lerobot_dataset(store.current)  # our reader, by feature names
    for a, b in zip(eps, back, strict=True):
        same(a, b)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset  # lerobot's own

    ds = LeRobotDataset(store.repo_id, root=store.current)
    assert ds.meta.total_episodes == 6 and ds.meta.total_frames == sum(len(e) for e in eps)
    assert "intervention" in ds.meta.features and "policy_version" in ds.meta.features
    assert len(list(store.views.iterdir())) == 1  # the old view is gone
    with pytest.raises(ValueError, match="holds 'multimodal_reach' episodes"):
        ExperienceStore.open(tmp_path / "store", "reacher")


def test_a_truncated_episode_file_cuts_the_store_to_its_last_whole_episode(tmp_path):
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    for i in range(5):
        store.append(episode(i))
    store.build_view()
    f = store.path(3)  # torn in the middle of the log: 3 and 4 go
    os.truncate(f, f.stat().st_size - 20)
    store, rec = ExperienceStore.open(tmp_path / "store", TASK)
    assert len(store) == 3 and rec.episodes == 3
    assert rec.quarantined == ["ep-00000003.safetensors", "ep-00000004.safetensors"]
    msg = str(rec)
    assert "recovered to its last whole episode (2; 3 in all)" in msg
    assert "episode 3 is damaged" in msg and "quarantine/" in msg
    assert len(list((tmp_path / "store" / "quarantine").iterdir())) == 2  # kept, not deleted
    # the view held 5 episodes, more than the spool now: rebuilt from the spool
    assert "rebuilt from the spool" in msg and not store.view_ok
    assert store.build_view() == 3 and store.view_episodes() == 3
    for a, b in zip(
        [episode(i) for i in range(3)], load_lerobot_dataset(store.current), strict=True
    ):
        same(a, b)
    assert store.append(episode(9)) == 3  # recording continues after the last whole one


@pytest.mark.parametrize("damage", ["parquet", "info.json"])
def test_a_truncated_lerobot_file_is_rebuilt_from_the_spool(tmp_path, damage):
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    for i in range(4):
        store.append(episode(i))
    store.build_view()
    live = store.current.resolve()
    f = next(live.glob("data/*/*.parquet")) if damage == "parquet" else live / "meta/info.json"
    os.truncate(f, f.stat().st_size // 2)
    store, rec = ExperienceStore.open(tmp_path / "store", TASK)
    assert len(store) == 4 and "did not open" in rec.view and "rebuilt" in str(rec)
    assert store.build_view() == 4
    assert [e.episode_id for e in load_lerobot_dataset(store.current)] == [100, 101, 102, 103]


def test_leftovers_of_interrupted_writes_are_removed_and_said(tmp_path):
    store, _ = ExperienceStore.open(tmp_path / "store", TASK)
    for i in range(2):
        store.append(episode(i))
    store.build_view()
    (store.spool / "ep-00000002.safetensors.tmp-999").write_bytes(b"half an episode")
    half_view = store.views / "v000009.tmp-999"
    half_view.mkdir()
    (store.root / "current.tmp-999").symlink_to(half_view)
    store, rec = ExperienceStore.open(tmp_path / "store", TASK)
    assert rec.partial_writes == 1 and "removed 1 partially written episode" in str(rec)
    assert len(store) == 2 and not half_view.exists()
    assert not (store.root / "current.tmp-999").exists() and store.view_episodes() == 2


CHILD = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_fleet_store import episode
from rlpost.robot.fleet.store import ExperienceStore
store, _ = ExperienceStore.open({root!r}, "multimodal_reach")
i = len(store)
print("ready", flush=True)
while True:
    store.append(episode(i, 400))
    i += 1
"""


def test_sigkill_while_appending_leaves_only_whole_episodes(tmp_path):
    """A writer killed at random instants, three times: every recorded episode reads back
    whole and equal to what was written, and recording continues where it stopped."""
    root = tmp_path / "store"
    code = CHILD.format(tests=os.path.dirname(__file__), root=str(root))
    total = 0
    for wait in (0.3, 0.45, 0.6):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(wait)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        store, rec = ExperienceStore.open(root, TASK)
        assert len(store) > total and not rec.quarantined
        total = len(store)
    for i, e in enumerate(store.read()):
        same(episode(i, 400), e)
