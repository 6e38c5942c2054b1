"""REVA-PO RER (004-09): per-response KL weights from advantage and reference entropy."""

import math

import pytest
import torch

from rlpost.core import KL_ESTIMATORS, Choice, KLInput, get_preset
from rlpost.core.regularizers import ResponseWeightedKLParams, reva_response_weights

torch.set_num_threads(1)
B, T = 4, 5


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    lengths = torch.tensor([5, 3, 4, 1])
    m = (torch.arange(T) < lengths[:, None]).float()
    return logp, ref, m


def test_weights_relax_good_and_tighten_bad_responses():
    p = ResponseWeightedKLParams(alpha=0.5, gamma=0.5, w_min=0.1, w_max=10.0)
    H = torch.zeros(5, 3)
    w = reva_response_weights(torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]), H, None, p)
    # exp(-0.5 A): 2.718, 1.649, 1, 0.607, 0.368
    torch.testing.assert_close(w, torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0]).exp())
    assert (w.diff() < 0).all()  # higher advantage -> weaker constraint
    # higher reference entropy -> weaker constraint; H = 0.8 nats: exp(-0.4)
    wh = reva_response_weights(
        torch.zeros(3), torch.tensor([0.0, 0.8, 2.0])[:, None].expand(3, 3), None, p
    )
    torch.testing.assert_close(wh, torch.tensor([1.0, math.exp(-0.4), math.exp(-1.0)]))
    # clipped to [w_min, w_max]
    wc = reva_response_weights(torch.tensor([-100.0, 100.0]), torch.zeros(2, 3), None, p)
    torch.testing.assert_close(wc, torch.tensor([10.0, 0.1]))


def test_token_advantages_and_entropy_use_the_masked_mean():
    p = ResponseWeightedKLParams()
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    A = torch.tensor([[1.0, 3.0, 99.0], [-1.0, 99.0, 99.0]])  # masked entries ignored
    H = torch.tensor([[0.2, 0.4, 99.0], [1.0, 99.0, 99.0]])
    w = reva_response_weights(A, H, m, p)
    torch.testing.assert_close(w, torch.tensor([math.exp(-1.0 - 0.15), math.exp(0.5 - 0.5)]))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_gradient_matches_the_weighted_closed_form(estimator):
    logp, ref, m = _inputs()
    A = torch.tensor([1.5, -0.5, 0.0, 2.0])
    kl = KL_ESTIMATORS.build("reva_rer", estimator=estimator)(
        KLInput(logp, ref, m, advantages=A)
    ).kl
    (g,) = torch.autograd.grad(kl.sum(), logp)
    # independent form: w_i = exp(-0.5 a_i - 0.5 h_i), h_i = mean over valid t of -ref
    h = (-ref * m).sum(1) / m.sum(1)
    w = torch.exp(-0.5 * A - 0.5 * h).clamp(0.1, 10.0)
    lr = logp.detach() - ref
    dk = {"k1": torch.ones_like(lr), "k2": lr, "k3": 1 - torch.exp(-lr)}[estimator]
    torch.testing.assert_close(g, w[:, None] * dk * m)
    val = {"k1": lr, "k2": 0.5 * lr**2, "k3": torch.exp(-lr) - 1 + lr}[estimator]
    torch.testing.assert_close(kl.detach(), w[:, None] * val * m)


def test_explicit_reference_entropy_and_no_weight_reduces_to_the_plain_estimator():
    logp, ref, m = _inputs(1)
    A = torch.randn(B)
    plain = KL_ESTIMATORS.build("k3")(KLInput(logp, ref, m)).kl
    flat = KL_ESTIMATORS.build("reva_rer", alpha=0.0, gamma=0.0)(
        KLInput(logp, ref, m, advantages=A)
    ).kl
    torch.testing.assert_close(flat, plain)
    Hx = torch.full((B, T), 0.5)
    kl = KL_ESTIMATORS.build("reva_rer", alpha=0.0, gamma=1.0)(
        KLInput(logp, ref, m, advantages=A, ref_entropy=Hx)
    ).kl
    torch.testing.assert_close(kl, math.exp(-0.5) * plain)


def test_missing_advantages_raise_naming_them():
    logp, ref, m = _inputs()
    with pytest.raises(ValueError, match="advantages"):
        KL_ESTIMATORS.build("reva_rer")(KLInput(logp, ref, m))
    with pytest.raises(Exception, match="w_min"):
        KL_ESTIMATORS.build("reva_rer", w_min=2.0)


def test_preset_passes_advantages_to_the_kl():
    logp, ref, m = _inputs(2)
    old = logp.detach() + 0.01
    A = torch.tensor([1.0, -1.0, 0.5, -0.5])
    preset = get_preset("reva_po")
    loss = preset.build().policy_loss(logp, old, A, m, ref_logp=ref).loss
    flat = preset.replace(kl=Choice("reva_rer", {"alpha": 0.0, "gamma": 0.0}))
    k3 = preset.replace(kl=Choice("k3"))
    l_flat = flat.build().policy_loss(logp, old, A, m, ref_logp=ref).loss
    l_k3 = k3.build().policy_loss(logp, old, A, m, ref_logp=ref).loss
    torch.testing.assert_close(l_flat, l_k3)  # unit weights: the grpo-style k3 recipe
    assert (loss - l_k3).abs() > 1e-4  # the response weights change the loss
