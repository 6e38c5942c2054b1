"""Numerical safety of the ratio / objective / KL entries of ratios.py, objectives.py,
offpolicy.py, divergence.py, group_objectives.py and kl.py.

* ``-inf`` padding: a masked token whose log-prob is ``-inf`` (a pad token, a tool output)
  must leave the loss and the gradient exactly as finite padding does (before the fix,
  ``(logp - old) * m`` gave ``-inf * 0 = NaN``, and ``cumsum`` carried it to later tokens).
* huge log-ratios: a log-ratio of 100 (``exp`` overflows float32 past ~88.7) must give a
  finite loss and gradient (before the fix, ``exp(lr) = inf`` in a branch discarded by
  ``where`` / ``minimum`` gave a ``0 * inf = NaN`` gradient).
"""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import KL_ESTIMATORS, OBJECTIVES, RATIOS, KLInput, ObjectiveInput, RatioInput
from rlpost.core.numerics import LOG_RATIO_MAX, safe_ratio

torch.set_num_threads(1)
B, T = 4, 6
GROUPS = torch.tensor([0, 0, 1, 1])
# the objectives of the modules under test (the others are owned elsewhere)
MINE = [
    "ppo_clip",
    "cispo",
    "reinforce",
    "ppo_clip_turn",
    "hard_pair_grpo",
    "ctpo_clip",
    "is_pg",
    "implicit_pessimism",
    "ess_adaptive",
    "up",
    "ripo",
    "sao",
    "mu_grpo",
    "conspo",
    "lpo",
]


def _mask():
    lengths = torch.tensor([6, 4, 2, 5])
    m = (torch.arange(T) < lengths[:, None]).float()
    m[0, 2] = 0.0  # a masked tool-output span inside a response
    m[3, 1] = 0.0
    return m


def _logps(pad: float):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=g) * 3
    old = (logp + 0.2 * torch.randn(B, T, generator=g)).clamp(max=0)
    m = _mask()
    logp = torch.where(m > 0, logp, torch.full_like(logp, pad))
    old = torch.where(m > 0, old, torch.full_like(old, pad))
    return logp.requires_grad_(True), old, m


@pytest.mark.parametrize("name", ["token", "sequence", "cumulative"])
def test_ratio_ignores_inf_padding(name):
    out = {}
    for pad in (-1.0, -torch.inf):
        logp, old, m = _logps(pad)
        lr = RATIOS.build(name)(RatioInput(logp, old, m)).log_ratio
        (g,) = torch.autograd.grad(lr.sum(), logp)
        assert torch.isfinite(lr).all() and torch.isfinite(g).all(), name
        assert (g[m == 0] == 0).all()
        out[pad] = (lr.detach(), g)
    assert_close(out[-1.0], out[-torch.inf], rtol=0, atol=0)


@pytest.mark.parametrize("name", MINE)
def test_objective_ignores_inf_padding(name):
    out = {}
    for pad in (-1.0, -torch.inf):
        logp, old, m = _logps(pad)
        A = torch.tensor([1.0, -0.5, 2.0, -1.0])
        res = OBJECTIVES.build(name)(ObjectiveInput(logp, old, A, m, group_ids=GROUPS))
        (g,) = torch.autograd.grad(res.loss.sum(), logp)
        assert torch.isfinite(res.loss).all() and torch.isfinite(g).all(), name
        assert (g[m == 0] == 0).all() and (res.loss[m == 0] == 0).all()
        out[pad] = (res.loss.detach(), g)
    assert_close(out[-1.0], out[-torch.inf], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_ignores_inf_padding_without_clamp(name):
    logp, old, m = _logps(-torch.inf)
    kl = KL_ESTIMATORS.build(name, clamp=None)(KLInput(logp, old, m)).kl
    (g,) = torch.autograd.grad(kl.sum(), logp)
    assert torch.isfinite(kl).all() and torch.isfinite(g).all() and (g[m == 0] == 0).all()


@pytest.mark.parametrize("name", MINE)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_objective_finite_for_huge_log_ratio(name, sign):
    # log r = 100 on two valid tokens (exp overflows float32), 0.05 elsewhere; the log-ratio
    # keeps its gradient path to logp
    logp, old, m = _logps(-1.0)
    shift = torch.full((B, T), 0.05)
    shift[0, 3] = shift[1, 0] = 100.0
    lr = logp - logp.detach() + shift
    A = sign * torch.tensor([1.0, 2.0, 0.5, 1.5])
    inp = ObjectiveInput(logp, old, A, m, log_ratio=lr, group_ids=GROUPS)
    res = OBJECTIVES.build(name)(inp)
    (g,) = torch.autograd.grad(res.loss.sum(), logp)
    assert torch.isfinite(res.loss).all(), f"{name}: loss {res.loss}"
    assert torch.isfinite(g).all(), f"{name}: gradient {g}"
    assert all(v == v for v in res.metrics.values()), res.metrics  # no NaN metric


def test_safe_ratio_saturates_with_zero_gradient_beyond_the_bound():
    x = torch.tensor([0.5, LOG_RATIO_MAX - 1.0, LOG_RATIO_MAX + 60.0], requires_grad=True)
    r = safe_ratio(x)
    (g,) = torch.autograd.grad(r.sum(), x)
    assert_close(r[:2], x[:2].detach().exp())  # plain exp below the bound
    assert torch.isfinite(r).all() and r[2] == r.new_tensor(LOG_RATIO_MAX).exp()
    assert_close(g, torch.stack([x[0].exp(), x[1].exp(), torch.tensor(0.0)]).detach())
    assert torch.isinf(torch.tensor(LOG_RATIO_MAX + 60.0).exp())  # plain exp would overflow
