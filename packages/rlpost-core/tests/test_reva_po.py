"""REVA-PO RER (004-09): per-response KL weights from advantage and reference entropy."""

import math

import pytest
import torch

from rlpost.core import KL_ESTIMATORS, Choice, KLInput, PolicyBatch, get_preset
from rlpost.core.kl import ResponseWeightedKLParams, reva_response_weights

B, T = 4, 5


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    lengths = torch.tensor([5, 3, 4, 1])
    m = (torch.arange(T) < lengths[:, None]).float()
    return logp, ref, m


def test_weights_relax_good_and_tighten_bad_responses():
    p = ResponseWeightedKLParams(alpha=0.5, gamma=0.5, w_min=0.1, w_max=10.0, entropy_center=None)
    H = torch.zeros(5, 3)
    w = reva_response_weights(torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0]), H, None, p)
    # exp(-0.5 A): 2.718, 1.649, 1, 0.607, 0.368
    torch.testing.assert_close(w, torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0]).exp())
    assert (w.diff() < 0).all()  # higher advantage -> weaker constraint
    # higher reference entropy -> weaker constraint; h centred on the batch mean (None)
    # (0 + 0.8 + 2) / 3 = 14/15: h = [-14/15, -2/15, 16/15], w = exp(-0.5 h)
    wh = reva_response_weights(
        torch.zeros(3), torch.tensor([0.0, 0.8, 2.0])[:, None].expand(3, 3), None, p
    )
    torch.testing.assert_close(wh, torch.tensor([7 / 15, 1 / 15, -8 / 15]).exp())
    # clipped to [w_min, w_max]
    wc = reva_response_weights(torch.tensor([-100.0, 100.0]), torch.zeros(2, 3), None, p)
    torch.testing.assert_close(wc, torch.tensor([10.0, 0.1]))


def test_token_advantages_and_entropy_use_the_masked_mean():
    p = ResponseWeightedKLParams(entropy_center=None)
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    A = torch.tensor([[1.0, 3.0, 99.0], [-1.0, 99.0, 99.0]])  # masked entries ignored
    H = torch.tensor([[0.2, 0.4, 99.0], [1.0, 99.0, 99.0]])
    # a = [2, -1]; h = [0.3, 1.0] - 1.6 / 3 (mean over the 3 valid tokens) = [-7/30, 14/30]
    want = torch.tensor([-1.0 + 7 / 60, 0.5 - 14 / 60]).exp()
    torch.testing.assert_close(reva_response_weights(A, H, m, p), want)
    # padding as engines leave it (-inf log-probs -> +inf entropy, NaN) is never read
    for fill in (math.inf, -math.inf, math.nan):
        Af, Hf = A.masked_fill(m == 0, fill), H.masked_fill(m == 0, fill)
        torch.testing.assert_close(reva_response_weights(Af, Hf, m, p), want)


def test_entropy_centre_options():
    # default centre 0 (split-invariant): 1.5 nats per token and A = 0 give exp(-0.75)
    # for every response, i.e. the KL acts with 0.47 kl_coef; a centre at the typical
    # entropy (1.5) keeps w = 1; None centres on the tensors passed in (mean log-weight 0)
    H = torch.full((6, 4), 1.5)
    default = ResponseWeightedKLParams(alpha=0.5, gamma=0.5)
    w = reva_response_weights(torch.zeros(6), H, None, default)
    torch.testing.assert_close(w, torch.full((6,), math.exp(-0.75)))
    at_typical = ResponseWeightedKLParams(alpha=0.5, gamma=0.5, entropy_center=1.5)
    torch.testing.assert_close(
        reva_response_weights(torch.zeros(6), H, None, at_typical), torch.ones(6)
    )
    batch = ResponseWeightedKLParams(alpha=0.5, gamma=0.5, entropy_center=None)
    torch.testing.assert_close(reva_response_weights(torch.zeros(6), H, None, batch), torch.ones(6))
    g = torch.Generator().manual_seed(0)
    Hr = 0.5 + 1.5 * torch.rand(64, 8, generator=g)
    lw = reva_response_weights(torch.zeros(64), Hr, None, batch).log()
    assert abs(float(lw.mean())) < 1e-6 and float(lw.std()) > 0.05
    with pytest.raises(ValueError, match="entropy_center"):
        ResponseWeightedKLParams(entropy_center=math.inf)


def test_fixed_centre_weights_do_not_depend_on_the_batch_split():
    logp, ref, m = _inputs(2)
    A = torch.tensor([1.0, -1.0, 0.5, 0.0])
    for centre, invariant in ((0.0, True), (1.0, True), (None, False)):
        fn = KL_ESTIMATORS.build("reva_rer", entropy_center=centre)
        full = fn(KLInput(logp, ref, m, advantages=A)).kl
        parts = torch.cat(
            [
                fn(KLInput(logp[s], ref[s], m[s], advantages=A[s])).kl
                for s in (slice(0, 1), slice(1, 4))
            ]
        )
        assert torch.allclose(full, parts) == invariant, centre


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_gradient_matches_the_weighted_closed_form(estimator):
    logp, ref, m = _inputs()
    A = torch.tensor([1.5, -0.5, 0.0, 2.0])
    kl = KL_ESTIMATORS.build("reva_rer", estimator=estimator)(
        KLInput(logp, ref, m, advantages=A)
    ).kl
    (g,) = torch.autograd.grad(kl.sum(), logp)
    # independent form: w_i = exp(-0.5 a_i - 0.5 h_i), h_i = mean over valid t of -ref
    # (the default centre is 0)
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
    # an explicit entropy replaces -ref: response means [0.5, 0.5, 0.5, 1.5] over the
    # valid tokens (lengths 5, 3, 4, 1), relative to the centre 0.5
    Hx = torch.full((B, T), 0.5)
    Hx[3] = 1.5
    kl = KL_ESTIMATORS.build("reva_rer", alpha=0.0, gamma=1.0, entropy_center=0.5)(
        KLInput(logp, ref, m, advantages=A, ref_entropy=Hx)
    ).kl
    h = torch.tensor([0.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(kl, (-h).exp()[:, None] * plain)


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
    loss = preset.build().policy_loss(PolicyBatch(logp, old, A, m, ref_logp=ref)).loss
    flat = preset.replace(kl=Choice("reva_rer", {"alpha": 0.0, "gamma": 0.0}))
    k3 = preset.replace(kl=Choice("k3"))
    l_flat = flat.build().policy_loss(PolicyBatch(logp, old, A, m, ref_logp=ref)).loss
    l_k3 = k3.build().policy_loss(PolicyBatch(logp, old, A, m, ref_logp=ref)).loss
    torch.testing.assert_close(l_flat, l_k3)  # unit weights: the grpo-style k3 recipe
    assert (loss - l_k3).abs() > 1e-4  # the response weights change the loss
