"""VPO (catalog 000-08): set-valued credit on vector rewards."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset


def vpo(R, g, **p):
    return ADVANTAGES.build("vpo", **p)(AdvantageInput(torch.tensor(R), torch.tensor(g))).advantages


def test_specialists_get_credit_that_scalarised_grpo_cannot_see():
    # equal weighted sums: GRPO gives every response 0; VPO credits the two specialists
    # (each is the best trade-off for half of the downstream weights) over the generalists
    R = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]
    g = [0, 0, 0, 0]
    grpo = ADVANTAGES.build("grpo")(AdvantageInput(torch.tensor(R), torch.tensor(g))).advantages
    assert_close(grpo, torch.zeros(4))
    a = vpo(R, g, n_weights=4096)
    assert a[0] > 0 and a[1] > 0 and a[2] < 0 and a[3] < 0
    assert_close(a[0], a[1], atol=0.1, rtol=0)  # symmetric up to Monte-Carlo error
    assert_close(a[2], a[3])


def test_hand_value_with_one_component():
    # K = 1: only the unique best is credited, by its margin over the runner-up (3 - 2)
    a = vpo([[3.0], [2.0], [0.0], [7.0], [7.0]], [0, 0, 0, 1, 1], scale_by_std=False)
    assert_close(a, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0], dtype=a.dtype))


def test_dominated_response_is_never_credited():
    torch.manual_seed(0)
    R = torch.rand(6, 3)
    R[5] = R[0] - 0.1  # strictly dominated by response 0
    a = ADVANTAGES.build("vpo", scale_by_std=False)(
        AdvantageInput(R, torch.zeros(6, dtype=torch.long))
    ).advantages
    assert a[5] <= a.min() + 1e-7


def test_needs_vector_rewards_and_preset():
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        ADVANTAGES.build("vpo")(AdvantageInput(torch.ones(4)))
    assert get_preset("vpo").catalog_id == "000-08"
