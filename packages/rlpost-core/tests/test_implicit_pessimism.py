"""Implicit-pessimism off-policy objective (catalog 000-01): gradient and induced target."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput

torch.set_num_threads(1)


def test_gradient_matches_hand_form():
    # stabilised: d loss / d log pi = beta (r - 1) - A+ + A- r; plain: beta (r - 1) - A
    beta = 0.5
    x = torch.tensor([[0.3, -0.2, 0.0, 0.7]])  # log r
    old = torch.log(torch.tensor([[0.2, 0.5, 0.1, 0.05]]))
    logp = (old + x).requires_grad_(True)
    A = torch.tensor([[1.0, -0.2, -2.0, -1.0]])
    m = torch.ones(1, 4)
    r = x.exp()
    expected = {
        # r = [1.3499, 0.8187, 1, 2.0138]: 0.5*0.3499 - 1 = -0.8251, 0.5*(-0.1813) + 0.2*0.8187
        # = 0.0731, 0 + 2 = 2, 0.5*1.0138 + 2.0138 = 2.5207
        True: beta * (r - 1) - A.clamp_min(0) + (-A).clamp_min(0) * r,
        False: beta * (r - 1) - A,  # the plain score function: no ratio on A
    }
    grads = {}
    for stabilize, g_hand in expected.items():
        f = OBJECTIVES.build("implicit_pessimism", beta=beta, stabilize=stabilize)
        out = f(ObjectiveInput(logp, old, A, m))
        (grads[stabilize],) = torch.autograd.grad(out.loss.sum(), logp)
        assert_close(grads[stabilize], g_hand)
    # the code's gradient against the hand-worked numbers of the comment above
    hand = torch.tensor([[-0.8251, 0.0731, 2.0, 2.5207]])
    assert_close(grads[True], hand, atol=1e-4, rtol=0)
    assert out.metrics["below_minus_beta_frac"] == pytest.approx(0.5)


MU = torch.tensor([0.35, 0.25, 0.15, 0.12, 0.08, 0.05], dtype=torch.float64)
IP_ID = "000-01"


def _softmax_fit(A, beta, stabilize, steps=1000, lr=2.0):
    """Minimise the population loss sum_y mu(y) loss(y) over softmax logits (plain GD)."""
    z = MU.log().clone().requires_grad_(True)
    f = OBJECTIVES.build("implicit_pessimism", beta=beta, stabilize=stabilize)
    K, losses = MU.numel(), []
    for _ in range(steps):
        logp = torch.log_softmax(z, 0)
        out = f(ObjectiveInput(logp[None], MU.log()[None], A[None], torch.ones(1, K)))
        loss = (MU * out.loss[0]).sum()
        (g,) = torch.autograd.grad(loss, z)
        with torch.no_grad():
            z -= lr * g
        losses.append(loss.item())
    return torch.softmax(z.detach(), 0), losses


def _bisect(f, lo, hi, increasing):
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) > 1) == increasing:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def nominal_target(A, beta):
    """argmax E_pi[A] - beta KL(mu || pi): pi = beta mu / (lambda - A), sum = 1."""
    lam = _bisect(lambda s: (beta * MU / (s - A)).sum(), A.max() + 1e-12, A.max() + 100, False)
    return beta * MU / (lam - A)


def stabilised_target(A, beta):
    """pi = mu (beta + A+) / (beta + A- - kappa), kappa normalising (independent closed form)."""
    ap, an = A.clamp_min(0), (-A).clamp_min(0)
    kappa = _bisect(
        lambda k: (MU * (beta + ap) / (beta + an - k)).sum(), -100.0, beta - 1e-12, True
    )
    return MU * (beta + ap) / (beta + an - kappa)


def _gain_kl(p, A):
    return (p * A).sum().item(), (p * (p / MU).log()).sum().item()


def test_induced_target_is_more_conservative_than_nominal(record_result):
    # one rare action with a large advantage: the upside where no-IS is pessimistic
    beta = 1.0
    A = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    A = A - (MU * A).sum()
    pi, _ = _softmax_fit(A, beta, stabilize=False)
    assert_close(pi, MU * (1 + A / beta), atol=1e-5, rtol=0)  # the linear tilt
    nominal = nominal_target(A, beta)
    gain, kl = _gain_kl(pi, A)
    gain_nom, kl_nom = _gain_kl(nominal, A)
    # measured: ratio of the good action 1.950 vs 4.472, E[A] 0.0475 vs 0.1736,
    # KL(pi || mu) 0.0188 vs 0.1783
    assert (pi / MU)[5] < 0.5 * (nominal / MU)[5]
    assert gain < 0.5 * gain_nom and kl < 0.5 * kl_nom
    row = {"case": "rare good action", "target_ratio": (pi / MU)[5].item()}
    row |= {"nominal_ratio": (nominal / MU)[5].item(), "gain": gain, "nominal_gain": gain_nom}
    row |= {"kl": kl, "nominal_kl": kl_nom}
    record_result("implicit_pessimism_targets", [_floats(row)], catalog_ids=[IP_ID])


def test_modification_bounds_the_induced_target(record_result):
    beta = 0.5
    A = torch.tensor([1.0, 0.2, -0.3, -1.5, 0.4, 0.1], dtype=torch.float64)
    A = A - (MU * A).sum()  # action 3 has A < -beta
    assert (MU * (1 + A / beta))[3] < 0  # the plain induced target has negative mass
    # plain: the loss falls without bound, the action's probability collapses
    pi_n, losses_n = _softmax_fit(A, beta, stabilize=False)
    assert losses_n[-1] < losses_n[len(losses_n) // 2] - 0.5
    assert pi_n[3] < 1e-12
    # stabilised: converges to its closed-form target, a positive distribution
    pi_s, losses_s = _softmax_fit(A, beta, stabilize=True)
    target = stabilised_target(A, beta)
    assert_close(pi_s, target, atol=1e-5, rtol=0)
    assert target.min() > 0.1 * MU.min() and abs(losses_s[-1] - losses_s[-100]) < 1e-9
    # and it is still more conservative than the nominal target (measured E[A] 0.4345 vs
    # 0.5248, KL(pi || mu) 0.2003 vs 0.3295, max ratio 1.810 vs 2.111)
    gain, kl = _gain_kl(target, A)
    gain_nom, kl_nom = _gain_kl(nominal_target(A, beta), A)
    assert gain < gain_nom and kl < kl_nom
    assert (target / MU).max() < (nominal_target(A, beta) / MU).max()
    row = {"case": "A < -beta", "plain_loss_half": losses_n[len(losses_n) // 2]}
    row |= {"plain_loss_end": losses_n[-1], "plain_prob_end": pi_n[3]}
    row |= {"stabilised_loss_end": losses_s[-1], "bad_ratio": (target / MU)[3]}
    row |= {"gain": gain, "nominal_gain": gain_nom, "kl": kl, "nominal_kl": kl_nom}
    row |= {
        "max_ratio": (target / MU).max(),
        "nominal_max_ratio": (nominal_target(A, beta) / MU).max(),
    }
    row |= {"steps": len(losses_n)}
    record_result("implicit_pessimism_targets", [_floats(row)], catalog_ids=[IP_ID])


def _floats(row):
    return {k: v.item() if torch.is_tensor(v) else v for k, v in row.items()}
