"""The shared feature space of 001-30's analysis: a top-k autoencoder that recovers a
planted dictionary, feature change and mediators by hand, steering that scales exactly
the chosen features' contribution."""

from __future__ import annotations

import pytest
import torch

from rlpost.core.features import TopKSAE, feature_change, mediators, steer, train_sae


def test_the_autoencoder_recovers_a_planted_sparse_dictionary():
    g = torch.Generator().manual_seed(0)
    dirs = torch.linalg.qr(torch.randn(16, 16, generator=g))[0][:8]  # 8 orthonormal rows
    pick = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(2000)])
    coef = torch.zeros(2000, 8).scatter(1, pick, torch.rand(2000, 2, generator=g) + 0.5)
    x = coef @ dirs + 0.3  # (an offset: the decoder bias takes it)
    sae, unexplained = train_sae(x, n=8, k=2, steps=500, lr=1e-2, batch=256)
    assert unexplained < 0.05
    a = sae.encode(x)
    assert int((a > 0).sum(1).max()) <= 2 and bool((a >= 0).all())
    best = (sae.dec @ dirs.T).abs().max(0).values  # each planted direction has a feature
    assert bool((best > 0.9).all())
    with torch.no_grad():
        untrained = TopKSAE(16, 8, 2)
        err = (untrained(x)[0] - x).square().sum() / (x - x.mean(0)).square().sum()
    assert float(err) > 0.5  # (the fit is what recovers them)


def test_feature_change_by_hand():
    a = torch.tensor([[1.0, 0, 0], [1, 0, 2], [0, 0, 0]])
    b = torch.tensor([[1.0, 0, 0], [0, 3, 2], [0, 0, 0]])
    c = feature_change(a, b)
    assert c.drift.tolist() == pytest.approx([1 / 3, 1.0, 0.0])  # ||(0,1,0)||^2 / (2 + 1)
    assert c.new.tolist() == [False, True, False] and not bool(c.lost.any())
    assert c.changed.tolist() == [False, True, False]
    assert c.summary() == pytest.approx({"live": 3, "new": 1, "lost": 0, "changed": 1,
                                         "mean_drift": 4 / 9, "new_median_freq": 1 / 3})  # fmt: skip
    back = feature_change(b, a)
    assert back.lost.tolist() == [False, True, False] and not bool(back.new.any())
    assert feature_change(a, a).summary()["mean_drift"] == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        feature_change(a, b[:2])


def test_mediators_are_the_features_firing_most_above_the_base():
    base = torch.tensor([[1.0, 0, 0, 2], [1, 0, 0, 2]])
    tuned = torch.tensor([[1.0, 3, 1, 0], [1, 1, 0, 2]])  # gaps 0, 2, 0.5, -1
    assert mediators(base, tuned, 2).tolist() == [1, 2]


def test_steering_scales_exactly_the_chosen_features():
    sae = TopKSAE(3, 3, 3)
    with torch.no_grad():  # features = the coordinates
        sae.dec.copy_(torch.eye(3))
        sae.enc.copy_(torch.eye(3))
    h = torch.tensor([[[2.0, 3.0, 0.5]]])
    f = torch.tensor([1])
    assert steer(h, sae, f, 0.0).tolist() == [[[2.0, 0.0, 0.5]]]
    assert steer(h, sae, f, 2.0).tolist() == [[[2.0, 6.0, 0.5]]]
    assert torch.equal(steer(h, sae, f, 1.0), h)
    with pytest.raises(ValueError, match="0 < k <= n"):
        TopKSAE(3, 3, 4)
