"""ED-GRPO (EDO, catalog 001-04): self-information reward bias keeps entropy up."""

import itertools

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset


def test_alpha_zero_is_grpo_and_hand_value():
    torch.manual_seed(0)
    r, g = torch.bernoulli(torch.full((8,), 0.5)), torch.arange(8) // 4
    lp, m = -torch.rand(8, 5), torch.ones(8, 5)
    grpo = ADVANTAGES.build("grpo")(AdvantageInput(r, g, m)).advantages
    ed0 = ADVANTAGES.build("ed_grpo", alpha=0.0)(AdvantageInput(r, g, m, logprobs=lp))
    assert_close(ed0.advantages, grpo)
    # all-correct group: the bonus alone separates the responses, less likely ones gain
    lp2 = torch.tensor([[-0.1, -0.1], [-2.0, -2.0]])
    a = ADVANTAGES.build("ed_grpo", alpha=0.1, scale_by_std=False)(
        AdvantageInput(
            torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 2), logprobs=lp2
        )
    ).advantages[:, 0]
    assert_close(a, torch.tensor([-0.095, 0.095]))


def test_bonus_is_added_after_normalisation_in_nats():
    # all-correct group, nll = [0.1, 2.0] (mean 1.05): GRPO(r) = 0 and the bonus is
    # alpha * (nll - 1.05) = alpha * [-0.95, 0.95] with or without the std scaling, so
    # alpha = 1e-4 pushes 1000x less than alpha = 0.1 (normalising the shaped reward made
    # both +-0.707)
    lp = torch.tensor([[-0.1, -0.1], [-2.0, -2.0]])
    inp = AdvantageInput(
        torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 2), logprobs=lp
    )
    for alpha in (1e-4, 0.1):
        a = ADVANTAGES.build("ed_grpo", alpha=alpha)(inp).advantages[:, 0]
        assert_close(a, alpha * torch.tensor([-0.95, 0.95]))
    # mixed group: GRPO's unit-scale advantage plus the centred bonus, padding ignored
    r = torch.tensor([1.0, 0.0, 0.0])
    lp = torch.tensor([[-1.0, -float("inf")], [-3.0, -3.0], [-2.0, -2.0]])
    m = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    out = ADVANTAGES.build("ed_grpo", alpha=0.5)(AdvantageInput(r, None, m, logprobs=lp))
    grpo = ADVANTAGES.build("grpo")(AdvantageInput(r, None, m)).advantages
    assert_close(out.advantages, grpo + 0.5 * torch.tensor([[-1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))


def train_bandit(alpha: float, steps: int = 300, seed: int = 0):
    """Softmax bandit: 3 correct arms of 10, groups of 8; returns (entropy, reward)."""
    gen = torch.Generator().manual_seed(seed)
    correct = torch.zeros(10)
    correct[:3] = 1.0
    logits = torch.zeros(10)
    logits[0] = 1.0  # the policy starts biased toward one correct arm
    logits.requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=0.05)
    fn = ADVANTAGES.build("ed_grpo", alpha=alpha)
    for _ in range(steps):
        pi = logits.softmax(0)
        a = torch.multinomial(pi.detach(), 32, replacement=True, generator=gen)
        lp = pi.log()[a]
        out = fn(
            AdvantageInput(
                correct[a], torch.arange(32) // 8, torch.ones(32, 1), logprobs=lp[:, None].detach()
            )
        )
        opt.zero_grad()
        (-(out.advantages[:, 0] * lp).mean()).backward()
        opt.step()
    pi = logits.detach().softmax(0)
    return float(-(pi * pi.log()).sum()), float(pi @ correct)


def test_entropy_stays_higher_than_grpo_at_equal_reward(record_result):
    h_grpo, r_grpo = train_bandit(0.0)  # 0.778 nats, reward 0.997
    h_ed, r_ed = train_bandit(0.1)  # 1.123 nats, reward 0.997
    assert r_ed > 0.97 and r_grpo > 0.97  # both solve the task
    assert h_ed > h_grpo + 0.3, (h_ed, h_grpo)  # ED keeps the three correct arms alive
    assert h_ed <= torch.log(torch.tensor(3.0)) + 0.15
    # the bonus scales with alpha: a negligible alpha is GRPO (0.781 nats)
    h_tiny, r_tiny = train_bandit(1e-4)
    assert abs(h_tiny - h_grpo) < 0.05, (h_tiny, h_grpo)
    ends = {0.0: (h_grpo, r_grpo), 1e-4: (h_tiny, r_tiny), 0.1: (h_ed, r_ed)}
    rows = [{"alpha": a, "entropy": h, "reward": r} for a, (h, r) in ends.items()]
    record_result("ed_grpo_bandit", rows, catalog_ids=["001-04"], seeds=[0])


def test_a_larger_alpha_keeps_more_entropy(record_result):
    """The bonus's size is ``alpha``'s alone: entropy rises with it, and only a large one
    (0.5) starts to cost reward by spreading mass onto wrong arms."""
    alphas = (0.01, 0.02, 0.05, 0.2, 0.5)
    ends = [train_bandit(a) for a in alphas]
    entropies = [h for h, _ in ends]
    assert all(x < y for x, y in itertools.pairwise(entropies)), entropies
    assert ends[-1][1] < min(r for _, r in ends[:-1]), ends
    rows = [{"alpha": a, "entropy": h, "reward": r} for a, (h, r) in zip(alphas, ends, strict=True)]
    record_result("ed_grpo_bandit", rows, catalog_ids=["001-04"], seeds=[0])


def test_needs_logprobs_and_preset():
    with pytest.raises(ValueError, match="logprobs"):
        ADVANTAGES.build("ed_grpo")(AdvantageInput(torch.ones(2), mask=torch.ones(2, 3)))
    assert get_preset("ed_grpo").catalog_id == "001-04"
