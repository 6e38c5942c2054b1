"""RDPO (catalog 000-24): quantile normalisation, subspace whitening, aggregation."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset
from rlpost.core.advantages.vector import magnitude_aware_quantile, whiten_subspaces


def test_binary_component_normalises_to_reward_minus_group_mean():
    r = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [1.0], [0.0], [1.0]], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    x = magnitude_aware_quantile(r, torch.ones_like(r, dtype=torch.bool), g)
    assert_close(x[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, -0.75, 0.25]).double())


def test_binary_and_continuous_rewards_land_on_comparable_scales():
    torch.manual_seed(0)
    B = 256
    g = torch.arange(B) // 8
    binary = torch.bernoulli(torch.full((B,), 0.5))
    continuous = 1000.0 * torch.randn(B) + 5e4  # a latency-like score in its own units
    R = torch.stack([binary, continuous], 1).double()
    x = magnitude_aware_quantile(R, torch.ones_like(R, dtype=torch.bool), g)
    std = x.std(0)
    assert 0.4 < float(std[0] / std[1]) < 2.5, std
    # a small within-group spread stays small (magnitude awareness)
    R2 = R.clone()
    R2[:8, 1] = 5e4 + 0.01 * torch.arange(8)
    x2 = magnitude_aware_quantile(R2, torch.ones_like(R2, dtype=torch.bool), g)
    assert x2[:8, 1].abs().max() < 1e-4


def test_whitened_components_have_identity_covariance_on_each_active_subspace():
    torch.manual_seed(1)
    B, K = 240, 3
    g = torch.arange(B) // 8
    base = torch.randn(B, 1)
    R = torch.cat(
        [base + 0.3 * torch.randn(B, 1), base + 0.3 * torch.randn(B, 1), torch.randn(B, 1)], 1
    )
    active = torch.ones(B, K, dtype=torch.bool)
    active[B // 2 :, 2] = False  # a second task without the third reward
    R = torch.where(active, R, torch.nan)
    out = ADVANTAGES.build("rdpo")(AdvantageInput(R, g, reward_mask=active))
    assert torch.isfinite(out.advantages).all()
    X = magnitude_aware_quantile(torch.nan_to_num(R.double()), active, g)
    Z = whiten_subspaces(X, active, 1e-6)
    for rows, cols in ((slice(0, B // 2), [0, 1, 2]), (slice(B // 2, B), [0, 1])):
        Zs = Z[rows][:, cols]
        cov = Zs.T @ Zs / Zs.shape[0]
        assert_close(cov, torch.eye(len(cols), dtype=cov.dtype), atol=1e-6, rtol=0)
    assert (Z[B // 2 :, 2] == 0).all()
    # before whitening the two correlated components were strongly correlated
    corr = torch.corrcoef(X[: B // 2, :2].T)[0, 1]
    assert corr > 0.7


def test_equal_rewards_give_zero_and_preset():
    R = torch.ones(8, 2)
    out = ADVANTAGES.build("rdpo")(AdvantageInput(R, torch.zeros(8, dtype=torch.long)))
    assert (out.advantages == 0).all()
    assert get_preset("rdpo").catalog_id == "000-24"
    with pytest.raises(ValueError, match="reward_mask"):
        AdvantageInput(R, reward_mask=torch.ones(8, 3, dtype=torch.bool))
