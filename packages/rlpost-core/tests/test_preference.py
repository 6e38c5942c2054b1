import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import PREFERENCE_LOSSES, PreferenceInput


def logsig(x):
    return -math.log1p(math.exp(-x))


def inp(**kw):
    base = {
        "chosen_logp": torch.tensor([-10.0, -5.0], requires_grad=True),
        "rejected_logp": torch.tensor([-12.0, -4.0], requires_grad=True),
        "ref_chosen_logp": torch.tensor([-11.0, -5.0]),
        "ref_rejected_logp": torch.tensor([-11.0, -5.0]),
        "chosen_len": torch.tensor([4, 5]),
        "rejected_len": torch.tensor([6, 2]),
    }
    base.update(kw)
    return PreferenceInput(**base)


def test_dpo_hand_values_and_gradient():
    # pair 0: (log ratio chosen 1) - (rejected -1) = 2 -> h = 0.1*2 = 0.2; loss = -logsig(0.2)
    # pair 1: (0) - (1) = -1 -> h = -0.1; loss = -logsig(-0.1)
    x = inp()
    out = PREFERENCE_LOSSES.build("dpo", beta=0.1)(x)
    assert_close(out.loss, torch.tensor([-logsig(0.2), -logsig(-0.1)]))
    out.loss.sum().backward()
    # d loss / d chosen = -beta * sigmoid(-h)
    assert_close(
        x.chosen_logp.grad, torch.tensor([-0.1 / (1 + math.exp(0.2)), -0.1 / (1 + math.exp(-0.1))])
    )
    assert out.metrics["reward_acc"] == 0.5


def test_dpo_label_smoothing():
    out = PREFERENCE_LOSSES.build("dpo", beta=0.1, label_smoothing=0.1)(inp())
    assert out.loss[0].item() == pytest.approx(-0.9 * logsig(0.2) - 0.1 * logsig(-0.2))


def test_ipo_hand_values():
    # h = 2 and -1, tau = 0.25 -> target 1/(2 tau) = 2: loss = 0 and 9
    out = PREFERENCE_LOSSES.build("ipo", tau=0.25)(inp())
    assert_close(out.loss, torch.tensor([0.0, 9.0]), atol=1e-6, rtol=0)


def test_simpo_hand_values():
    # r_w = 2 * -10/4 = -5, r_l = 2 * -12/6 = -4 -> loss -logsig(-5 + 4 - 1) = -logsig(-2)
    # r_w = 2 * -5/5 = -2, r_l = 2 * -4/2 = -4 -> -logsig(-2 + 4 - 1) = -logsig(1)
    out = PREFERENCE_LOSSES.build("simpo", beta=2.0, gamma=1.0)(inp())
    assert_close(out.loss, torch.tensor([-logsig(-2.0), -logsig(1.0)]))


def test_missing_reference_raises():
    with pytest.raises(ValueError, match="ref_chosen_logp"):
        PREFERENCE_LOSSES.build("dpo")(inp(ref_chosen_logp=None))
