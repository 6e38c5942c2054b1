"""RiVER (catalog 004-29): calibrated ranking-induced shaping of continuous scores."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset


def river(scores, groups, **params):
    inp = AdvantageInput(torch.tensor(scores, dtype=torch.float32), torch.tensor(groups))
    return ADVANTAGES.build("river", **params)(inp).advantages


def test_hand_values():
    # distinct values 3 > 2 > 1 (U = 3): shaped 1, c*(3-2)/2 = 0.25, 0 (c = 0.5);
    # baseline (1 + 0.25 + 0)/3 = 5/12 -> A = 7/12, -2/12, -5/12; a singleton group -> 0
    assert_close(
        river([3.0, 2.0, 1.0, 7.0], [0, 0, 0, 1]), torch.tensor([7 / 12, -2 / 12, -5 / 12, 0.0])
    )


def test_invariant_to_per_instance_affine_rescaling():
    torch.manual_seed(0)
    scores = torch.randint(0, 6, (24,)).float()
    groups = torch.arange(24) // 8
    a = torch.tensor([0.01, 3.0, 250.0])[groups]  # wildly different scales per instance
    b = torch.tensor([-5.0, 0.0, 1e4])[groups]
    base = river(scores.tolist(), groups.tolist())
    assert_close(river((a * scores + b).tolist(), groups.tolist()), base)


@pytest.mark.parametrize("k", [1, 3, 15])
def test_duplicate_low_scores_cannot_outweigh_one_top_sample(k):
    adv = river([10.0] + [1.0] * k, [0] * (k + 1))
    top, low = adv[0], adv[1:]
    assert top > 0 and (low < 0).all()
    assert low.abs().sum() <= top + 1e-6  # the k duplicates together weigh as one sample
    assert_close(low.abs().sum(), torch.tensor(0.5))  # independent of k


def test_top_gets_the_largest_advantage_and_others_stay_bounded():
    adv = river([5.0, 4.0, 3.0, 2.0, 1.0], [0] * 5, other_credit=0.9)
    assert int(adv.argmax()) == 0
    assert (adv[1:] < adv[0]).all() and torch.all(adv[1:-1] > adv[-1])


def test_equal_scores_give_zero_and_preset_builds():
    assert_close(river([2.0, 2.0, 2.0], [0, 0, 0]), torch.zeros(3))
    assert get_preset("river").catalog_id == "004-29"
    with pytest.raises(ValueError, match="other_credit"):
        ADVANTAGES.build("river", other_credit=1.5)
