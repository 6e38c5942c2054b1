"""StepOPSD (catalog 000-03): sign-preserving step-level advantage shaping."""

import pytest
import torch

from rlpost.core.advantages import ADVANTAGES, AdvantageInput, grpo
from rlpost.core.advantages.classic import GRPOParams
from rlpost.core.advantages.steps import StepOPSDParams, step_opsd


def _inp(rewards, turn_ids, student, teacher, groups=None, mask=None):
    turn_ids = torch.tensor(turn_ids)
    mask = (turn_ids >= 0).float() if mask is None else torch.tensor(mask, dtype=torch.float)
    r = torch.tensor(rewards, dtype=torch.float)
    g = torch.tensor(groups) if groups is not None else torch.zeros(len(rewards), dtype=torch.long)
    return AdvantageInput(
        rewards=r,
        group_ids=g,
        mask=mask,
        turn_ids=turn_ids,
        logprobs=torch.tensor(student, dtype=torch.float),
        teacher_logprobs=torch.tensor(teacher, dtype=torch.float),
    )


def test_hand_worked_two_steps():
    # one success and one failure; each has two steps of two tokens, obs token between
    tids = [[0, 0, -1, 1, 1], [0, 0, -1, 1, 1]]
    student = [[-1.0] * 5, [-1.0] * 5]
    # success: the teacher endorses step 0 (gap +1), disowns step 1 (gap -1)
    # failure: the same gaps
    teacher = [[0.0, 0.0, 5.0, -2.0, -2.0], [0.0, 0.0, 5.0, -2.0, -2.0]]
    inp = _inp([1.0, 0.0], tids, student, teacher)
    p = StepOPSDParams(alpha_clip=0.2, lambda_mix=0.5)
    out = step_opsd(inp, p).advantages
    a = 1 / (2**0.5 / 2 + 1e-6) * 0.5  # GRPO: (1 - 0.5) / std (unbiased std of [1, 0])
    # c = (+1, -1); success: s = (+0.2, -0.2), f = (1.1, 0.9); failure: s = (-0.2, +0.2)
    expect = torch.tensor(
        [[a * 1.1, a * 1.1, 0.0, a * 0.9, a * 0.9], [-a * 0.9, -a * 0.9, 0.0, -a * 1.1, -a * 1.1]]
    )
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-6)


def test_shaping_never_flips_the_sign():
    torch.manual_seed(0)
    B, T = 64, 24
    for _ in range(8):
        tids = torch.randint(-1, 6, (B, T))
        rewards = torch.randint(0, 2, (B,)).float() + torch.rand(B)
        groups = torch.arange(B) // 8
        student = torch.randn(B, T) * 10
        teacher = torch.randn(B, T) * 100  # huge, arbitrary gaps
        inp = AdvantageInput(
            rewards=rewards,
            group_ids=groups,
            mask=(tids >= 0).float(),
            turn_ids=tids,
            logprobs=student,
            teacher_logprobs=teacher,
        )
        for alpha, lam in ((0.2, 0.5), (0.99, 1.0), (0.5, 1.0)):
            adv = step_opsd(inp, StepOPSDParams(alpha_clip=alpha, lambda_mix=lam)).advantages
            base = grpo(inp, GRPOParams()).advantages
            valid = tids >= 0
            assert torch.isfinite(adv).all()
            assert (torch.sign(adv[valid]) == torch.sign(base[valid])).all()
            # the credit budget: per trajectory, the summed token advantage is GRPO's
            torch.testing.assert_close(adv.sum(1), base.sum(1), rtol=1e-4, atol=1e-4)
            # the local trust region bounds the ratio between two steps' credit
            ratio = (adv / base.where(base != 0, 1.0)).where(valid & (base != 0), 1.0)
            bound = (1 + lam * alpha) / (1 - lam * alpha)
            assert float(ratio.amax(1).div(ratio.amin(1)).max()) <= bound * (1 + 1e-4)


def test_reduces_to_grpo():
    tids = [[0, 0, -1, 1, -1, 2], [0, -1, 1, 1, 1, -1], [0, 0, 0, 0, -1, -1]]
    student = torch.randn(3, 6).tolist()
    teacher = torch.randn(3, 6).tolist()
    inp = _inp([1.0, 0.0, 0.5], tids, student, teacher)
    base = grpo(inp, GRPOParams()).advantages
    # no mixing
    torch.testing.assert_close(step_opsd(inp, StepOPSDParams(lambda_mix=0.0)).advantages, base)
    # the teacher agrees with the student everywhere
    same = _inp([1.0, 0.0, 0.5], tids, student, student)
    torch.testing.assert_close(step_opsd(same, StepOPSDParams()).advantages, base)
    # a one-step trajectory (row 2) is GRPO's whatever the gaps
    out = step_opsd(inp, StepOPSDParams(alpha_clip=0.9, lambda_mix=1.0)).advantages
    torch.testing.assert_close(out[2], base[2])


def test_masked_tokens_and_degenerate_groups():
    tids = [[0, 0, 1, 1], [0, 0, 1, 1]]
    inp = _inp([1.0, 1.0], tids, [[0.0] * 4] * 2, [[1.0, 1.0, -9.0, -9.0]] * 2)
    out = step_opsd(inp, StepOPSDParams()).advantages
    assert torch.equal(out, torch.zeros(2, 4))  # equal rewards: nothing, and no NaN
    masked = _inp(
        [1.0, 0.0],
        tids,
        [[0.0] * 4] * 2,
        [[1.0, 1.0, -9.0, float("nan")]] * 2,
        mask=[[1, 1, 1, 0], [1, 1, 1, 0]],
    )
    out = step_opsd(masked, StepOPSDParams()).advantages
    assert torch.isfinite(out).all() and (out[:, 3] == 0).all()


def test_contract_declares_its_inputs():
    entry = ADVANTAGES.build("step_opsd")
    assert {"turns", "behaviour_logprobs", "teacher_logprobs"} <= {str(x) for x in entry.needs}
    with pytest.raises(ValueError, match="alpha_clip"):
        StepOPSDParams(alpha_clip=1.0)
