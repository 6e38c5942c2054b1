import sys

import numpy as np
import pytest

from rlpost.robot.demos import Episode, collect_demos, collect_episodes, make_expert
from rlpost.robot.envs import TASKS
from rlpost.robot.lerobot_data import load_lerobot_dataset, write_lerobot_dataset


class RandomPolicy:
    def __init__(self, act_dim, seed=0):
        self.act_dim, self.rng = act_dim, np.random.default_rng(seed)

    def __call__(self, obs):
        return self.rng.uniform(-1, 1, self.act_dim)


def _rate(eps):
    return float(np.mean([e.success for e in eps]))


# episodes per policy: enough for a wide margin, few enough for < 30 s in all
N_EPISODES = {"reacher": 16, "multimodal_reach": 16, "contour": 12, "pusher": 12}
# Pusher-v5's nearly massless puck makes pushing slow: far pucks cannot be brought in
MIN_GOOD = {"reacher": 0.8, "multimodal_reach": 0.8, "contour": 0.8, "pusher": 0.5}


@pytest.mark.parametrize("task", sorted(t for t in TASKS if TASKS[t].base is None))
def test_good_expert_beats_poor_beats_random(task):  # (image variants share these experts)
    n = N_EPISODES[task]
    good = _rate(collect_episodes(task, make_expert(task, "good", seed=1), n, seed=10))
    poor = _rate(collect_episodes(task, make_expert(task, "poor", seed=1), n, seed=10))
    rand = _rate(collect_episodes(task, RandomPolicy(TASKS[task].act_dim), n, seed=10))
    assert good >= MIN_GOOD[task], (good, poor, rand)
    assert good >= poor + 0.4, (good, poor, rand)
    assert poor >= rand - 0.1, (good, poor, rand)


def test_collect_episodes_records_consistent_episodes():
    class Counting:
        def __init__(self):
            self.resets = 0

        def reset(self):
            self.resets += 1

        def __call__(self, obs):
            return np.full(3, 2.0)  # out of range: recorded clipped

    pol = Counting()
    eps = collect_episodes("contour", pol, n_episodes=3, seed=0, quality="poor")
    assert pol.resets == 3 and len(eps) == 3
    spec = TASKS["contour"]
    for ep in eps:
        t = len(ep)
        assert isinstance(ep, Episode) and ep.task == "contour" and ep.quality == "poor"
        assert ep.obs.shape == (t + 1, spec.obs_dim) and ep.obs.dtype == np.float32
        assert ep.actions.shape == (t, spec.act_dim) and ep.actions.dtype == np.float32
        assert ep.rewards.shape == (t,) and ep.rewards.dtype == np.float32
        assert np.all(ep.actions == 1.0)
        assert ep.metrics["length"] == t
        assert ep.metrics["return"] == pytest.approx(float(ep.rewards.sum()), rel=1e-5)
        assert ep.success == ep.metrics["success"] == bool(ep.step_success[-1])
        assert ep.contact_force.shape == (t,)
        assert ep.metrics["peak_force"] == pytest.approx(float(ep.contact_force.max()), rel=1e-5)


def test_collect_episodes_is_deterministic_and_batched_matches_sequential():
    class Linear:  # deterministic, batched, per-env stateless
        def reset(self, env_ids=None):
            pass

        def __call__(self, obs):
            obs = np.asarray(obs)
            return np.tanh(obs[..., 4:6] - obs[..., 0:2])

    a = collect_episodes("multimodal_reach", Linear(), n_episodes=5, seed=3)
    b = collect_episodes("multimodal_reach", Linear(), n_episodes=5, seed=3, n_envs=3)
    c = collect_episodes("multimodal_reach", Linear(), n_episodes=5, seed=4)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.actions, y.actions)
        assert x.seed == y.seed and x.metrics == y.metrics
    assert not np.array_equal(a[0].obs[0], c[0].obs[0])
    with pytest.raises(ValueError, match="reset"):
        collect_episodes("reacher", make_expert("reacher"), n_episodes=2, n_envs=2)


def test_multimodal_good_demos_are_bimodal_and_their_average_fails():
    demos = collect_demos("multimodal_reach", n_good=20, n_poor=0, seed=0)
    reached = []
    for ep in demos:
        assert ep.success and ep.quality == "good"
        goals = ep.obs[-1, 4:8].reshape(2, 2)
        reached.append(int(np.argmin(np.linalg.norm(goals - ep.obs[-1, :2], axis=1))))
    assert min(np.bincount(reached, minlength=2)) >= 5  # both goals, in both directions

    class AverageOfModes:  # what an MSE policy fitted to the good demos converges to
        def __call__(self, obs):
            v = 2.5 * (obs[4:6] - obs[:2]) + 2.5 * (obs[6:8] - obs[:2])
            return np.clip(v, -1, 1)

    assert _rate(collect_episodes("multimodal_reach", AverageOfModes(), 10, seed=1)) == 0.0


def test_contour_poor_demos_spike_the_force_and_good_ones_do_not():
    demos = collect_demos("contour", n_good=6, n_poor=6, seed=0)
    thr = TASKS["contour"].force_threshold
    good = [e.metrics["peak_force"] for e in demos if e.quality == "good"]
    poor = [e.metrics["peak_force"] for e in demos if e.quality == "poor"]
    assert len(good) == len(poor) == 6
    assert max(good) < thr < min(poor)
    assert np.median(poor) > 2 * np.median(good)
    frac = {
        q: np.mean([e.metrics["frac_force_above"] for e in demos if e.quality == q])
        for q in ("good", "poor")
    }
    assert frac["good"] < 0.05 < frac["poor"]


def test_collect_demos_is_a_labelled_deterministic_mix():
    a = collect_demos("reacher", n_good=3, n_poor=2, seed=7)
    b = collect_demos("reacher", n_good=3, n_poor=2, seed=7)
    assert [e.quality for e in a] == ["good"] * 3 + ["poor"] * 2
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.actions, y.actions)


def test_make_expert_rejects_bad_arguments():
    with pytest.raises(ValueError, match="valid tasks"):
        make_expert("nope")
    with pytest.raises(ValueError, match="quality"):
        make_expert("reacher", quality="great")


def test_lerobot_dataset_round_trip(tmp_path):
    pytest.importorskip("lerobot")
    demos = collect_demos("contour", n_good=1, n_poor=1, seed=0)
    root = write_lerobot_dataset(demos, tmp_path / "contour_demos", task="contour")
    assert (root / "meta" / "info.json").exists()
    back = load_lerobot_dataset(root)
    assert len(back) == len(demos)
    for x, y in zip(demos, back, strict=True):
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.actions, y.actions)
        np.testing.assert_array_equal(x.rewards, y.rewards)
        np.testing.assert_array_equal(x.step_success, y.step_success)
        np.testing.assert_array_equal(x.contact_force, y.contact_force)
        assert (x.success, x.terminated, x.quality, y.task) == (
            y.success,
            y.terminated,
            y.quality,
            "contour",
        )
        for k in ("length", "success", "ever_success"):
            assert x.metrics[k] == y.metrics[k]
        for k in ("return", "peak_force", "frac_force_above"):
            assert x.metrics[k] == pytest.approx(y.metrics[k], rel=1e-5)
    with pytest.raises(FileExistsError):  # LeRobotDataset.create needs a fresh root
        write_lerobot_dataset(demos, root, task="contour")


def test_lerobot_missing_gives_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "lerobot.datasets.lerobot_dataset", None)
    with pytest.raises(ImportError, match=r"pip install 'rlpost-robot\[lerobot\]'"):
        write_lerobot_dataset([], tmp_path / "x", task="reacher")
    with pytest.raises(ImportError, match="lerobot"):
        load_lerobot_dataset(tmp_path / "x")


ARM = {"x.pos": "shoulder_pan.pos", "y.pos": "shoulder_lift.pos", "z.pos": "elbow_flex.pos",
       "x.vel": "shoulder_pan.vel", "y.vel": "shoulder_lift.vel", "z.vel": "elbow_flex.vel",
       "contact_force": "wrist.force"}  # fmt: skip


def _foreign_dataset(root, demos, reward=True, act_suffix=""):
    """A data set as someone else's recorder writes it: every float in one
    ``observation.state`` in its own order and names, actions named like an arm's in
    another order, robot_type an arm's, no ``next.observation`` / ``quality``."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from rlpost.robot.envs import TASKS

    spec = TASKS["contour"]
    names = [ARM.get(n, n) for n in spec.obs_names][::-1]
    perm = [spec.obs_names.index({v: k for k, v in ARM.items()}.get(n, n)) for n in names]
    act = [ARM[n] + act_suffix for n in spec.act_names][::-1]
    features = {
        "observation.state": {"dtype": "float32", "shape": (len(names),), "names": names},
        "action": {"dtype": "float32", "shape": (3,), "names": act},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }
    if reward:
        features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
    ds = LeRobotDataset.create(repo_id="me/arm", fps=25, features=features, root=root,
                               robot_type="so101_follower", use_videos=False)  # fmt: skip
    for ep in demos:
        for t in range(len(ep.actions)):
            frame = {
                "observation.state": ep.obs[t, perm].astype(np.float32),
                "action": ep.actions[t, ::-1].astype(np.float32),
                "next.done": np.array([t == len(ep.actions) - 1]),
                "task": "press and slide",
            }
            if reward:
                frame["next.reward"] = np.array([ep.rewards[t]], np.float32)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return root


def test_any_robot_type_and_layout_maps_onto_the_task_by_name(tmp_path):
    pytest.importorskip("lerobot")
    demos = collect_demos("contour", n_good=1, n_poor=1, seed=1)
    root = _foreign_dataset(tmp_path / "arm", demos)
    rename = {v: k for k, v in ARM.items()}
    back = load_lerobot_dataset(root, task="contour", rename=rename)
    assert len(back) == 2
    for x, y in zip(demos, back, strict=True):
        np.testing.assert_array_equal(x.obs[:-1], y.obs[:-1])  # every frame, by name
        np.testing.assert_array_equal(y.obs[-1], x.obs[-2])  # no next.observation: last frame
        np.testing.assert_array_equal(x.actions, y.actions)
        np.testing.assert_array_equal(x.rewards, y.rewards)
        np.testing.assert_array_equal(y.contact_force[:-1], x.obs[1:-1, 6])  # next reading
        assert y.task == "contour" and y.quality == ""
    only_first = load_lerobot_dataset(root, task="contour", rename=rename, episodes=[1])
    np.testing.assert_array_equal(only_first[0].actions, demos[1].actions)
    with pytest.raises(ValueError, match=r"robot_type 'so101_follower' is not a task"):
        load_lerobot_dataset(root)
    with pytest.raises(ValueError, match=r"no observation feature named \['x.pos'.*data.rename"):
        load_lerobot_dataset(root, task="contour")
    no_reward = _foreign_dataset(tmp_path / "arm2", demos[:1], reward=False)
    with pytest.raises(ValueError, match=r"no next\.reward"):
        load_lerobot_dataset(no_reward, task="contour", rename=rename)
    with pytest.raises(FileNotFoundError, match="not a LeRobotDataset"):
        load_lerobot_dataset(tmp_path / "nothing", task="contour")


def test_the_policy_keeps_each_sides_data_names_when_both_map_to_one_task_name(tmp_path):
    """``shoulder_pan.pos`` (observed) and ``shoulder_pan.pos.goal`` (commanded) both map
    to the task's ``x.pos``. Before: the inverse mapping kept the last, so
    ``policy/features.json`` told a deployed policy to read the commanded value."""
    pytest.importorskip("lerobot")
    from rlpost.robot.config import load_config, recipe_path
    from rlpost.robot.train import policy_features

    demos = collect_demos("contour", n_good=1, n_poor=0, seed=1)
    root = _foreign_dataset(tmp_path / "arm", demos, act_suffix=".goal")
    rename = {v: k for k, v in ARM.items()} | {
        ARM[n] + ".goal": n for n in ("x.pos", "y.pos", "z.pos")
    }
    assert len(load_lerobot_dataset(root, task="contour", rename=rename)) == 1
    pairs = ", ".join(f"{k}: {v}" for k, v in rename.items())
    cfg = load_config(
        recipe_path("pac_act_contour"), [f"data.path={root}", f"data.rename={{{pairs}}}"]
    )
    fm = policy_features(cfg)
    spec = TASKS["contour"]
    assert fm.observation == tuple(ARM.get(n, n) for n in spec.obs_names)
    assert fm.action == tuple(ARM[n] + ".goal" for n in spec.act_names)


def test_a_data_set_without_next_success_reports_success_as_unknown_not_0(tmp_path):
    """Before: every episode of a data set recorded without ``next.success`` counted as
    failed, and the train command printed 'data demonstrations succeed 0%'."""
    pytest.importorskip("lerobot")
    from rlpost.robot.demos import success_rate
    from rlpost.robot.train import _share

    demos = collect_demos("contour", n_good=2, n_poor=0, seed=1)
    rename = {v: k for k, v in ARM.items()}
    back = load_lerobot_dataset(_foreign_dataset(tmp_path / "arm", demos), "contour", rename=rename)
    assert success_rate(back) is None and all(e.metrics["success"] is None for e in back)
    assert _share(success_rate(back)).startswith("unknown")
    assert success_rate(demos) == sum(d.success for d in demos) / 2  # recorded: as before
    assert _share(0.5) == "50%"


def test_an_evaluation_counts_its_episodes_in_a_bar(capsys):
    """Before: ``rlpost-robot train`` evaluated 3 x 100 episodes before and after training
    with nothing on the screen."""
    import torch

    from rlpost.robot.algos.common import evaluate_policy
    from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

    spec = TASKS["reacher"]
    torch.manual_seed(0)
    pi = FlowChunkPolicy(FlowPolicyConfig(spec.obs_dim, spec.act_dim, horizon=4, hidden=16))
    quiet = evaluate_policy(pi, "reacher", 6, 2, seed=1, envs=4)
    assert capsys.readouterr().err == ""
    shown = evaluate_policy(pi, "reacher", 6, 2, seed=1, envs=4, progress="evaluating after")
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "evaluating after:" in err and "/6 [" in err
    assert shown == quiet  # the bar changes nothing it measures
    ends = []
    collect_episodes("reacher", make_expert("reacher", "good", seed=0), 5, seed=2,
                     done=lambda: ends.append(1))  # fmt: skip
    assert len(ends) == 5  # one tick per finished episode
