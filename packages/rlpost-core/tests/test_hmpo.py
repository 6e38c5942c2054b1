"""HMPO (catalog 004-11b): median-length token-efficiency shaping."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput


def hmpo(rewards, lengths, groups=None, **params):
    L = torch.tensor(lengths)
    mask = (torch.arange(int(L.max())) < L[:, None]).float()
    g = torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups)
    return ADVANTAGES.build("hmpo", **params)(
        AdvantageInput(torch.tensor(rewards), g, mask)
    ).advantages[:, 0]


def test_hand_values():
    # correct lengths 2, 4, 6 -> median 4; bonus 0.2 * (4 - len) / 4 = +0.1, 0, -0.1
    # shaped 1.1, 1.0, 0.9, 0, 0 -> mean 0.6 -> A = 0.5, 0.4, 0.3, -0.6, -0.6 (no std)
    adv = hmpo([1.0, 1.0, 1.0, 0.0, 0.0], [2, 4, 6, 3, 5], scale_by_std=False)
    assert_close(adv, torch.tensor([0.5, 0.4, 0.3, -0.6, -0.6]))


def test_shorter_than_median_correct_gain_and_accuracy_order_is_kept():
    torch.manual_seed(0)
    rewards = (torch.rand(64) > 0.5).float()
    lengths = torch.randint(1, 40, (64,))
    groups = torch.arange(64) // 8
    shaped = hmpo(rewards.tolist(), lengths.tolist(), groups.tolist(), alpha=0.45)
    plain = ADVANTAGES.build("grpo")(AdvantageInput(rewards, groups)).advantages
    for gi in range(8):
        idx = groups == gi
        ok, bad = shaped[idx & (rewards > 0)], shaped[idx & (rewards == 0)]
        if len(ok) and len(bad):
            assert ok.min() > bad.max(), "every correct response stays above every wrong one"
        c = idx & (rewards > 0)
        if c.sum() > 2:
            med = lengths[c].sort().values[(int(c.sum()) - 1) // 2]
            short, long = c & (lengths < med), c & (lengths > med)
            if short.any() and long.any():
                assert shaped[short].min() > shaped[long].max()
    assert not torch.allclose(shaped, plain)


def test_alpha_zero_is_grpo_and_validation():
    r, lens = [1.0, 0.0, 1.0, 0.0], [3, 5, 7, 2]
    plain = ADVANTAGES.build("grpo")(
        AdvantageInput(torch.tensor(r), torch.zeros(4, dtype=torch.long))
    ).advantages
    assert_close(hmpo(r, lens, alpha=0.0), plain)
    with pytest.raises(ValueError, match="alpha"):
        ADVANTAGES.build("hmpo", alpha=0.6)
    with pytest.raises(ValueError, match=r"needs mask \(AdvantageInput\.mask\)"):
        ADVANTAGES.build("hmpo")(AdvantageInput(torch.tensor(r)))
