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
