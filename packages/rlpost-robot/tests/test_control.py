"""Pair-GRPO's control experiment (catalog 001-14b): the ``rlpost-robot control`` loop
learns HalfCheetah from scratch with GRPO's and Soft-Pair-GRPO's advantages alike."""

from __future__ import annotations

import pytest

from rlpost.robot.config import load_job, recipe_path
from rlpost.robot.control import run_control


@pytest.mark.parametrize("preset", ["soft_pair_grpo", "grpo"])
def test_the_sampled_return_rises_from_scratch(preset, tmp_path):
    """16 iterations (0.1 M steps, about 8 s): the sampled return climbs from the random
    policy's (about -45) by more than 15. A flipped advantage or a lost gradient fails."""
    job = load_job(
        "control",
        recipe_path("pair_grpo_half_cheetah", "control"),
        [f"preset={preset}", "iterations=16", "eval_every=0", "run.progress=false",
         f"run.dir={tmp_path / 'run'}"],
    )  # fmt: skip
    history = run_control(job)["history"]
    returns = [h["return"] for h in history]
    assert len(returns) == 16
    assert sum(returns[-3:]) / 3 > sum(returns[:3]) / 3 + 15


def test_mujoco_warnings_reach_python_once_and_gymnasiums_own_deprecation_is_dropped(
    recwarn,
):
    """A HalfCheetah built after the handler is set warns nothing (its model file's
    ``settotalmass`` deprecation is dropped), and another MuJoCo warning arrives as a
    Python ``RuntimeWarning`` instead of being printed and appended to MUJOCO_LOG.TXT."""
    import gymnasium as gym
    import mujoco

    from rlpost.robot.control import _mujoco_warnings_to_python

    _mujoco_warnings_to_python()
    gym.make("HalfCheetah-v5").close()
    assert not [w for w in recwarn if "mujoco" in str(w.message)]
    model = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body><joint/><geom size='.1'/></body></worldbody></mujoco>"
    )
    data = mujoco.MjData(model)
    data.qpos[0] = float("nan")  # a bad state: MuJoCo warns and resets
    mujoco.mj_step(model, data)
    assert any("mujoco: " in str(w.message) for w in recwarn)
