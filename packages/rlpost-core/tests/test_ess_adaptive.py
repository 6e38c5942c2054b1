"""ESS-adaptive objective (catalog 000-27): no hyper-parameters, tightens with concentration."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput

torch.set_num_threads(1)
f = OBJECTIVES.build("ess_adaptive")


def _grad(x, A, m=None, old=None):
    """Gradient w.r.t. log pi with log r = x."""
    old = torch.full_like(x, -1.0) if old is None else old
    logp = (old + x).requires_grad_(True)
    m = torch.ones_like(x) if m is None else m
    out = f(ObjectiveInput(logp, old, A, m))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    return g, out.metrics


def test_gradient_matches_hand_worked_example():
    # ratios nine 1s and one 6: sum 15, sum of squares 45, N 10 -> ess = 225/450 = 0.5,
    # cap C = 1/(1 - 0.5) = 2, lam = 0.5, mean r = 1.5 -> rho = 2/3 (ones) and 4 -> capped 2
    r = torch.ones(2, 5)
    r[1, 4] = 6.0
    A = torch.tensor([1.0, -0.5])
    g, met = _grad(r.log(), A)
    # d loss / d log pi = -min(rho, C) A + lam log r
    expected = torch.full((2, 5), -2 / 3)
    expected[1] = 2 / 3 * 0.5
    expected[1, 4] = -2.0 * -0.5 + 0.5 * math.log(6.0)  # 1 + 0.8959 = 1.8959
    assert_close(g, expected)
    assert met["ess"] == pytest.approx(0.5) and met["ess_cap"] == pytest.approx(2.0)
    assert met["ess_reg"] == pytest.approx(0.5) and met["clip_frac"] == pytest.approx(0.1)


def test_masked_tokens_do_not_enter_the_statistic():
    r = torch.ones(2, 5)
    r[1, 4] = 50.0  # masked: must not change anything
    m = torch.ones(2, 5)
    m[1, 4] = 0
    g, met = _grad(r.log(), torch.tensor([1.0, 1.0]), m)
    assert met["ess"] == 1.0 and (g[m == 0] == 0).all()
    assert_close(g[m == 1], -torch.ones(9))


@pytest.mark.parametrize("level", [1.0, 1.7])
def test_uniform_ratios_give_the_on_policy_score_function(level):
    # every ratio equal (at the behaviour policy, or uniformly rescaled): ess = 1,
    # weight 1, no regulariser -> exactly -A grad log pi
    g_ = torch.Generator().manual_seed(0)
    A = torch.randn(4, 6, generator=g_)
    x = torch.full((4, 6), math.log(level))
    g, met = _grad(x, A)
    assert met["ess"] == pytest.approx(1.0, abs=1e-12) and met["ess_reg"] < 1e-6
    assert_close(g, -A, rtol=1e-5, atol=1e-6)


def test_tightens_as_ratios_concentrate(record_result):
    g_ = torch.Generator().manual_seed(1)
    z = torch.randn(8, 16, generator=g_)
    A = torch.ones(8, 16)
    rows = []
    for s in (0.05, 0.25, 0.5, 1.0, 2.0):
        x = s * z
        g, met = _grad(x, A)
        g0, _ = _grad(x, torch.zeros_like(A))  # the regulariser alone
        top = x.argmax()
        rho = x.exp() / x.exp().mean()
        trimmed = (rho - rho.clamp(max=met["ess_cap"])).sum() / rho.sum()  # IS mass cut
        rows.append((met["ess"], met["ess_cap"], met["ess_reg"], trimmed.item()))
        # the highest-ratio token keeps a score-function push of weight min(rho, C) >= 1
        # (PPO's clip would give it none); the rest of its gradient is the pull back
        push = (g0 - g).flatten()[top].item()
        assert 1.0 - 1e-5 <= push <= met["ess_cap"] + 1e-5
    ess, cap, reg, cut = map(list, zip(*rows, strict=True))
    # measured (s = 0.05, 0.25, 0.5, 1, 2): ess 0.9975, 0.938, 0.769, 0.381, 0.095;
    # cap 407, 16.2, 4.33, 1.62, 1.11; share of the IS weight mass cut 0, 0, 0, 0.28, 0.69
    assert ess == sorted(ess, reverse=True) and ess[0] > 0.99 and ess[-1] < 0.1
    assert cap == sorted(cap, reverse=True) and cap[-1] < 1.2
    assert reg == sorted(reg)
    assert cut == sorted(cut) and cut[0] == 0.0 and cut[-1] > 0.5
    spread = (0.05, 0.25, 0.5, 1.0, 2.0)
    out = [{"s": s_, "ess": e, "cap": c, "reg": r, "is_mass_cut": t}
           for s_, (e, c, r, t) in zip(spread, rows, strict=True)]  # fmt: skip
    record_result("ess_adaptive_concentration", out, catalog_ids=["000-27"], seeds=[1])
    # the regulariser pulls back to the behaviour policy: with A = 0, g * log r >= 0
    g0, _ = _grad(2.0 * z, torch.zeros(8, 16))
    assert (g0 * z >= 0).all() and g0.abs().max() > 0.5


def test_one_overflowing_ratio_gives_a_finite_loss():
    # log r = 100 on one of N = 10 tokens: r overflows float32. In log space:
    # ess = (sum r)^2 / (N sum r^2) -> e^200 / (10 e^200) = 1/N = 0.1, rho of that token
    # = r / mean r -> N = 10, capped at C = 1 / (1 - 0.1) = 1.111; the others rho -> 0
    x = torch.zeros(2, 5)
    x[0, 2] = 100.0
    A = torch.tensor([1.0, -1.0])
    g, met = _grad(x, A)
    assert torch.isfinite(g).all() and all(math.isfinite(v) for v in met.values()), met
    assert met["ess"] == pytest.approx(0.1) and met["ess_cap"] == pytest.approx(1 / 0.9)
    # d loss / d log pi = -min(rho, C) A + lam log r, lam = 0.9
    expected = torch.zeros(2, 5)
    expected[0, 2] = -1 / 0.9 + 0.9 * 100.0
    assert_close(g, expected)


def test_log_space_ess_matches_direct_formula():
    from rlpost.core.objectives.offpolicy import normalized_ess, normalized_ess_log

    g = torch.Generator().manual_seed(0)
    x = 1.5 * torch.randn(4, 9, generator=g, dtype=torch.float64)
    m = (torch.rand(4, 9, generator=g) > 0.3).double()
    r = x.exp()[m > 0]
    direct = r.sum() ** 2 / (r.numel() * (r * r).sum())
    assert_close(normalized_ess_log(x, m), direct)
    assert_close(normalized_ess(x.exp(), m), direct)
    assert normalized_ess_log(x, torch.zeros_like(m)).item() == 1.0  # nothing valid
