"""ICR (catalog 001-10): compression pull toward the shortest correct responses when overthinking."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput


def run(name, rewards, lengths, **params):
    L = torch.tensor(lengths)
    mask = (torch.arange(int(L.max())) < L[:, None]).float()
    inp = AdvantageInput(torch.tensor(rewards), torch.zeros(len(rewards), dtype=torch.long), mask)
    return ADVANTAGES.build(name, **params)(inp)


def test_off_when_length_accuracy_correlation_is_non_negative():
    # longer answers are the correct ones (rho > 0: underthinking) -> exactly GRPO
    rewards, lengths = [1.0, 1.0, 0.0, 0.0], [9, 8, 3, 2]
    out = run("icr", rewards, lengths, coef=0.3)
    assert_close(out.advantages, run("grpo", rewards, lengths).advantages)
    assert out.metrics["icr_targets"] == 0.0


def test_pulls_toward_shortest_correct_when_overthinking():
    # shorter answers are more often correct (rho < 0): the shortest correct (len 2) gains coef
    rewards, lengths = [1.0, 1.0, 0.0, 0.0], [2, 5, 8, 9]
    out = run("icr", rewards, lengths, coef=0.3)
    base = run("grpo", rewards, lengths).advantages
    delta = (out.advantages - base)[:, 0]
    assert_close(delta, torch.tensor([0.3, 0.0, 0.0, 0.0]))
    assert out.metrics["icr_active_frac"] == 1.0


def test_degenerate_groups_are_finite_and_off():
    out = run("icr", [1.0, 1.0, 1.0], [2, 5, 7], coef=0.3)  # all correct: rho undefined -> off
    assert torch.isfinite(out.advantages).all() and out.metrics["icr_targets"] == 0.0
    with pytest.raises(ValueError, match="coef"):
        ADVANTAGES.build("icr", coef=-1.0)


def test_an_exactly_uncorrelated_group_gets_no_compression_bonus():
    """The correct answers' mean length (7) equals the group's: rho = 0, the regulariser is
    off. In float32 the covariance rounded to a tiny negative number and the shortest
    correct answer got the bonus anyway (8 of 99 such random groups)."""
    lengths = [5, 5, 10, 5, 8, 5, 11]
    correct = [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    mask = (torch.arange(11) < torch.tensor(lengths)[:, None]).float()
    inp = AdvantageInput(torch.tensor(correct), torch.zeros(7, dtype=torch.long), mask)
    out = ADVANTAGES.build("icr", coef=0.5)(inp)
    plain = ADVANTAGES.build("grpo")(AdvantageInput(torch.tensor(correct), inp.group_ids, mask))
    torch.testing.assert_close(out.advantages, plain.advantages)
    assert out.metrics["icr_targets"] == 0.0
