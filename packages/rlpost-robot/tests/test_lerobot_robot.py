"""The deploy loop through lerobot's Robot interface, on the MuJoCo-backed robot."""

from pathlib import Path

import numpy as np
import pytest

from rlpost.robot.envs import TASKS, make_env
from rlpost.robot.lerobot_robot import MujocoRobot, MujocoRobotConfig, deploy


def _robot(tmp_path: Path, task: str = "reacher") -> MujocoRobot:
    return MujocoRobot(MujocoRobotConfig(task=task, seed=3, calibration_dir=tmp_path / "calib"))


def test_robot_speaks_lerobots_interface(tmp_path):
    from lerobot.robots import Robot
    from lerobot.utils.errors import DeviceNotConnectedError

    robot = _robot(tmp_path)
    assert isinstance(robot, Robot)
    spec = TASKS["reacher"]
    assert len([k for k in robot.observation_features if k.startswith("state.")]) == spec.obs_dim
    assert list(robot.action_features) == [f"action.{j}" for j in range(spec.act_dim)]
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
    keys = [k for k in robot.observation_features if k.startswith("state.")]
    for a in actions:
        ref, *_ = env.step(a)
        robot.send_action({f"action.{j}": float(v) for j, v in enumerate(a)})
    got = np.array([robot.get_observation()[k] for k in keys], dtype=np.float32)
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
