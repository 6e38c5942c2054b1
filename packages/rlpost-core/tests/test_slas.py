"""The advantages the diffusion methods use, from core's registry: GRPO with Flow-GRPO's
clip, SLAS (catalog 000-29) and the reward-weighted regression weights."""

import pytest
import torch

from rlpost.core import ADVANTAGES, AdvantageInput

GIDS = torch.tensor([0, 0, 0, 1, 1, 1])


def adv(name, r, **p):
    return ADVANTAGES.build(name, **p)(AdvantageInput(r, GIDS)).advantages


def test_grpo_hand_worked_degenerate_group_and_clip():
    r = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 0.5])
    a = adv("grpo", r, eps=1e-12)
    # group 0: mean 1/3, unbiased std sqrt(1/3)
    std = (1 / 3) ** 0.5
    assert torch.allclose(a[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / std)
    assert torch.equal(a[3:], torch.zeros(3))  # equal rewards: 0, no NaN
    assert adv("grpo", r * 100, clip=1.0).abs().max() == 1.0
    assert torch.allclose(adv("grpo", r, scale_by_std=False)[:3], r[:3] - 1 / 3)
    with pytest.raises(ValueError, match="clip must be > 0"):
        ADVANTAGES.build("grpo", clip=0.0)


def test_slas_is_super_linear_scale_free_and_linear_at_gamma_zero():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(6, generator=g)
    lin = adv("slas", r, gamma=0.0)
    # gamma 0: the group-centred rewards over their batch population std
    centred = r - torch.tensor([r[:3].mean()] * 3 + [r[3:].mean()] * 3)
    assert torch.allclose(lin, centred / (centred.std(unbiased=False) + 1e-4))
    shaped = adv("slas", r, gamma=0.5, eps=1e-12)
    assert torch.equal(shaped.sign(), lin.sign())
    i, j = int(lin.abs().argmax()), int(lin.abs().argmin())
    # pairwise ratios are raised to the power 1 + gamma
    assert (shaped[i] / shaped[j]).abs() == pytest.approx(float((lin[i] / lin[j]).abs() ** 1.5))
    # |A| > 1 grows, |A| < 1 shrinks: informative samples amplified, noise suppressed
    assert shaped.abs()[lin.abs() > 1].gt(lin.abs()[lin.abs() > 1]).all()
    assert shaped.abs()[lin.abs() < 1].lt(lin.abs()[lin.abs() < 1]).all()
    # batch-level normalisation: invariant to reward scale and per-group shift
    shifted = r * 7.0 + torch.tensor([3.0, 3, 3, -2, -2, -2])
    assert torch.allclose(adv("slas", shifted, gamma=0.5, eps=1e-12), shaped, atol=1e-5)
    with pytest.raises(ValueError, match="gamma"):
        ADVANTAGES.build("slas", gamma=-0.1)


def test_reward_weights_nonnegative_mean_one():
    w = ADVANTAGES.build("reward_weighted", temperature=0.5)(
        AdvantageInput(torch.tensor([0.0, 1.0, 2.0]))
    ).advantages
    assert (w > 0).all() and w.mean() == pytest.approx(1.0)
    assert w[2] / w[1] == pytest.approx(float(torch.exp(torch.tensor(2.0))))
    with pytest.raises(ValueError, match="temperature"):
        ADVANTAGES.build("reward_weighted", temperature=0.0)
