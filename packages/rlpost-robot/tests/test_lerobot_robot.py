"""The deploy loop through lerobot's Robot interface, on the MuJoCo-backed robot."""

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from rlpost.robot.envs import TASKS, make_env
from rlpost.robot.features import FeatureMap
from rlpost.robot.lerobot_robot import MujocoRobot, MujocoRobotConfig, deploy


def _robot(tmp_path: Path, task: str = "reacher") -> MujocoRobot:
    return MujocoRobot(MujocoRobotConfig(task=task, seed=3, calibration_dir=tmp_path / "calib"))


def test_robot_speaks_lerobots_interface(tmp_path):
    from lerobot.robots import Robot
    from lerobot.utils.errors import DeviceNotConnectedError

    robot = _robot(tmp_path)
    assert isinstance(robot, Robot)
    spec = TASKS["reacher"]
    assert list(robot.observation_features)[: spec.obs_dim] == list(spec.obs_names)
    assert list(robot.action_features) == ["shoulder.effort", "elbow.effort"]
    with pytest.raises(DeviceNotConnectedError):
        robot.get_observation()
    with robot:  # lerobot's context manager connects and disconnects
        obs = robot.get_observation()
        assert set(obs) == set(robot.observation_features)
        sent = robot.send_action({k: 5.0 for k in robot.action_features})
        assert all(v == 1.0 for v in sent.values())  # clipped to the normalised bounds
        with pytest.raises(KeyError, match="missing"):
            robot.send_action({})
    assert not robot.is_connected


def test_robot_trajectory_equals_the_simulator_under_the_same_actions(tmp_path):
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(20, TASKS["reacher"].act_dim)).astype(np.float32)
    env = make_env("reacher", seed=3)
    ref, _ = env.reset(seed=3)
    robot = _robot(tmp_path)
    robot.connect()
    fmap = FeatureMap.for_task("reacher")
    for a in actions:
        ref, *_ = env.step(a)
        robot.send_action(fmap.action_dict(a))
    got = fmap.observation_vector(robot.get_observation())
    assert np.allclose(got, ref, atol=1e-6)
    robot.disconnect()


def test_deploy_runs_episodes_and_reports_force_on_the_contact_task(tmp_path):
    robot = _robot(tmp_path, "contour")
    robot.connect()
    zero = lambda obs: np.zeros(TASKS["contour"].act_dim, dtype=np.float32)  # noqa: E731
    results = deploy(zero, robot, episodes=2, max_steps=15)
    robot.disconnect()
    assert len(results) == 2 and all(r["steps"] <= 15 for r in results)
    assert all(r["peak_force"] is not None and r["peak_force"] >= 0 for r in results)


def test_unknown_task_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        _robot(tmp_path, "walker")


class _ArmNamed:
    """A robot of someone else's (not one of ours): the contour robot behind features named
    like a 3-motor arm's (``{motor}.pos``), in another order -- the shape of lerobot's
    SO-101 ``shoulder_pan.pos``, ``elbow_flex.pos``, ... features."""

    RENAME: ClassVar = {"x.pos": "shoulder_pan.pos", "y.pos": "shoulder_lift.pos", "z.pos": "elbow_flex.pos",
              "x.vel": "shoulder_pan.vel", "y.vel": "shoulder_lift.vel",
              "z.vel": "elbow_flex.vel"}  # fmt: skip

    def __init__(self, inner: MujocoRobot) -> None:
        self.inner = inner

    def _out(self, d):
        named = {self.RENAME.get(k, k): v for k, v in d.items()}
        return dict(reversed(list(named.items())))  # another order than the policy's

    @property
    def observation_features(self):
        return self._out(self.inner.observation_features)

    @property
    def action_features(self):
        return self._out(self.inner.action_features)

    def get_observation(self):
        return self._out(self.inner.get_observation())

    def send_action(self, action):
        back = {v: k for k, v in self.RENAME.items()}
        return self.inner.send_action({back.get(k, k): v for k, v in action.items()})

    def reset(self, seed=None):
        self.inner.reset(seed)

    @property
    def episode_done(self):
        return self.inner.episode_done


def test_deploy_maps_features_by_name_on_a_robot_speaking_motor_pos_names(tmp_path):
    """The same policy on the same simulated arm gives the same episodes whether the robot
    uses the task's names or an arm's ``{motor}.pos`` names in another order, once the
    policy's map is renamed; a map naming features the robot lacks fails before a step."""
    target = np.array([0.1, -0.05, 0.3], dtype=np.float32)

    def policy(obs):  # reads x/y/z by position in the policy's vector
        return np.clip((target - obs[:3]) * 3 + obs[:3], -1, 1)

    runs = []
    for renamed in (False, True):
        inner = _robot(tmp_path / str(renamed), "contour")
        inner.connect()
        robot = _ArmNamed(inner) if renamed else inner
        fmap = FeatureMap.for_task("contour")
        if renamed:
            fmap = fmap.renamed(_ArmNamed.RENAME)
            assert "shoulder_pan.pos" in robot.action_features
        runs.append(deploy(policy, robot, episodes=2, max_steps=12, features=fmap))
        inner.disconnect()
    assert runs[0] == runs[1]
    inner = _robot(tmp_path / "x", "contour")
    inner.connect()
    with pytest.raises(ValueError, match=r"lacks the policy's observation features \['x.pos'"):
        deploy(policy, _ArmNamed(inner), episodes=1, max_steps=3,
               features=FeatureMap.for_task("contour"))  # fmt: skip
    inner.disconnect()
