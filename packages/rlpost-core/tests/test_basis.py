"""BASIS (catalog 000-02): one rollout per prompt, a baseline pooled across the batch."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, get_preset
from rlpost.core.advantages import loo_ridge_values


def test_loo_ridge_equals_refitting_without_each_prompt():
    torch.manual_seed(0)
    B, D, lam = 12, 3, 0.7
    F = torch.randn(B, D, dtype=torch.float64)
    y = torch.randn(B, dtype=torch.float64)
    fast, used = loo_ridge_values(y, F, lam)
    assert used == lam
    for i in range(B):
        keep = torch.arange(B) != i
        X = torch.cat([torch.full((B, 1), 1e3, dtype=torch.float64), F], 1)
        Xk = X[keep]
        w = torch.linalg.solve(
            Xk.T @ Xk + lam * torch.eye(D + 1, dtype=torch.float64), Xk.T @ y[keep]
        )
        assert_close(fast[i], X[i] @ w)


def test_without_features_it_is_the_leave_one_out_batch_mean():
    # basis declares that it needs prompt features; called without them it refuses
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="'basis' needs prompt_features"):
        ADVANTAGES.build("basis")(AdvantageInput(r))
    # the raw estimator on no features is the leave-one-out batch mean baseline
    fn = ADVANTAGES.get("basis").fn
    out = fn(AdvantageInput(r), ADVANTAGES.build("basis", ridge=1e-6).params).advantages
    loo = (r.sum() - r) / 4
    assert_close(out, r - loo, atol=1e-4, rtol=0)


def test_baseline_never_sees_its_own_reward():
    # flipping r_i changes A_i by exactly the flip: V_i does not depend on r_i
    torch.manual_seed(1)
    F = torch.randn(16, 4)
    r = torch.bernoulli(torch.full((16,), 0.5))
    fn = ADVANTAGES.build("basis", ridge=1.0)
    a = fn(AdvantageInput(r, prompt_features=F)).advantages
    r2 = r.clone()
    r2[3] = 1 - r2[3]
    a2 = fn(AdvantageInput(r2, prompt_features=F)).advantages
    assert_close(a2[3] - a[3], r2[3] - r[3], atol=1e-5, rtol=0)


def test_informative_features_beat_the_batch_mean_baseline():
    torch.manual_seed(2)
    B = 256
    u = torch.randn(B, 8)
    p = torch.sigmoid(2.0 * u[:, 0] - 1.0 * u[:, 1])  # heterogeneous success rates
    F = u + 0.3 * torch.randn(B, 8)
    errs = {"basis": [], "batch_mean": []}
    for _ in range(20):
        r = torch.bernoulli(p)
        v_basis = (
            r
            - ADVANTAGES.build("basis", normalize_features=False)(
                AdvantageInput(r, prompt_features=F)
            ).advantages
        )
        errs["basis"].append(((v_basis - p) ** 2).mean())
        errs["batch_mean"].append(((r.mean() - p) ** 2).mean())
    basis, batch = torch.stack(errs["basis"]).mean(), torch.stack(errs["batch_mean"]).mean()
    assert basis < 0.6 * batch, (basis, batch)


def test_validation_and_preset():
    # automatic ridge: uninformative features fall back towards the batch mean
    torch.manual_seed(3)
    r = torch.bernoulli(torch.full((128,), 0.4))
    out = ADVANTAGES.build("basis")(AdvantageInput(r, prompt_features=torch.randn(128, 16)))
    assert out.metrics["basis_ridge"] >= 100
    with pytest.raises(ValueError, match="ridge"):
        ADVANTAGES.build("basis", ridge=0.0)
    assert get_preset("basis").group_size == 1
