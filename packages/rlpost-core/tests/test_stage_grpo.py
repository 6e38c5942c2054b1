"""Stage-Structured GRPO (RubricEM, 000-30): per-stage advantages from stagewise rubric
judgments, each stage normalised within its prompt's group."""

from __future__ import annotations

import math

import pytest
import torch

from rlpost.core.advantages import ADVANTAGES, AdvantageInput
from rlpost.core.presets import get_preset

R2 = 1 / math.sqrt(2)
# two trajectories of one prompt: research turns 0 and 1, then the answer (turn 2);
# -1: observation tokens (not the policy's)
TID = torch.tensor([[0, 0, -1, 1, -1, 2], [0, 0, -1, 1, -1, 2]])
STAGES = torch.tensor([[0, 0, 1], [0, 0, 1]])


def _adv(turn_rewards, rewards=(1.0, 0.0), stages=STAGES, tid=TID, mask=None, **params):
    est = ADVANTAGES.build("stage_grpo", **params)
    mask = (tid >= 0).float() if mask is None else mask
    return est(
        AdvantageInput(
            torch.tensor(rewards),
            group_ids=torch.zeros(len(rewards), dtype=torch.long),
            mask=mask,
            turn_ids=tid,
            turn_rewards=torch.tensor(turn_rewards),
            turn_stages=stages,
        )
    ).advantages


def test_hand_worked_stage_and_outcome_advantages():
    # research rubric means 0.5 and 1.0, answer rubric 1 and 0, outcome 1 and 0: each
    # stage's z-score is -+1/sqrt(2), the outcome's +-1/sqrt(2)
    adv = _adv([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    want = torch.tensor([[0, 0, 0, 0, 0, 2 * R2], [0, 0, 0, 0, 0, -2 * R2]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)
    only_stage = _adv([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], outcome_weight=0.0)
    want = torch.tensor([[-R2, -R2, 0, -R2, 0, R2], [R2, R2, 0, R2, 0, -R2]])
    torch.testing.assert_close(only_stage, want, atol=1e-5, rtol=0)


def test_a_stage_is_credited_by_its_own_rubric_only():
    base = _adv([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], outcome_weight=0.0)
    moved = _adv([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], outcome_weight=0.0)  # research ties
    answer = TID == 2
    torch.testing.assert_close(moved[answer], base[answer])
    assert not torch.allclose(moved[TID == 0], base[TID == 0])
    # one broadcast terminal reward would give every token of a trajectory one value;
    # here a failed answer after good research still credits the research
    assert base[1, 0] > 0 > base[1, 5]


def test_uniform_groups_and_absent_stages_give_zero_without_nan():
    adv = _adv([[0.5, 0.5, 1.0], [0.5, 0.5, 1.0]], rewards=(1.0, 1.0))
    assert torch.equal(adv, torch.zeros_like(adv))
    # trajectory 1 never answered (its stage-1 slot is absent): the answer stage has one
    # trajectory, a singleton group, so 0 there; the research stage still compares both
    tid = torch.tensor([[0, 0, -1, 1, -1, 2], [0, 0, -1, 1, -1, -1]])
    stages = torch.tensor([[0, 0, 1], [0, 0, -1]])
    adv = _adv([[1.0, 1.0, 1.0], [0.0, 0.0, float("nan")]], stages=stages, tid=tid,
               outcome_weight=0.0)  # fmt: skip
    assert torch.isfinite(adv).all() and adv[0, 5] == 0.0
    assert adv[0, 0] > 0 > adv[1, 0]


def test_masked_tokens_get_zero_and_without_stages_each_turn_is_its_own():
    mask = (TID >= 0).float()
    mask[0, 1] = 0.0
    adv = _adv([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], mask=mask)
    assert adv[0, 1] == 0.0 and adv[0, 0] != 0.0
    per_turn = _adv([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]], stages=None, outcome_weight=0.0)
    # turn 0 equal in both (z 0), turn 1: 0 vs 1, turn 2: 1 vs 0
    torch.testing.assert_close(per_turn[:, 0], torch.zeros(2))
    torch.testing.assert_close(per_turn[:, 3], torch.tensor([-R2, R2]), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_turn[:, 5], torch.tensor([R2, -R2]), atol=1e-5, rtol=0)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="turn_stages must be"):
        AdvantageInput(
            torch.zeros(2), turn_rewards=torch.zeros(2, 3), turn_stages=torch.zeros(2, 2)
        )
    with pytest.raises(ValueError, match="needs turns"):
        ADVANTAGES.build("stage_grpo")(AdvantageInput(torch.zeros(2), mask=torch.ones(2, 3)))
    with pytest.raises(ValueError, match=">= 0"):
        ADVANTAGES.build("stage_grpo", stage_weight=-1.0)
    assert get_preset("rubricem").advantage.name == "stage_grpo"
