"""Predictive divergence mask (catalog 004-05): closed-form direction vs autograd, top-K
estimators converging as K grows, the mask rule and its plumbing through Recipe."""

import itertools

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import CORRECTIONS, PolicyBatch, RatioInput, get_preset
from rlpost.core.ratios import TokenDistributions
from rlpost.core.ratios.divergence import (
    divergence_and_direction,
    predictive_divergence,
    topk_predictive_divergence,
)

PDM_ID = "004-05"

torch.set_num_threads(1)


def reference(z, mu, y, kind):
    """Independent form: autograd of D(mu, softmax(z)) dotted with the PG step e_y - pi."""
    z = z.clone().requires_grad_(True)
    pi = z.softmax(-1)
    kl = (mu * (mu.log() - pi.log())).sum(-1)
    d = kl if kind == "kl" else 0.5 * (pi - mu).abs().sum(-1)
    (g,) = torch.autograd.grad(d.sum(), z)
    step = torch.nn.functional.one_hot(y, z.shape[-1]).double() - pi.detach()
    return d.detach(), (g * step).sum(-1)


@pytest.mark.parametrize("kind", ["kl", "tv"])
def test_closed_form_matches_autograd_small_vocab(kind):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    z_old = z + 0.7 * torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 4), generator=g)
    d, s = predictive_divergence(z, z_old, y, kind)
    d_ref, s_ref = reference(z, z_old.softmax(-1), y, kind)
    assert_close(d.double(), d_ref)
    assert_close(s.double(), s_ref)
    # and s is the first-order change of D along the step: finite difference, h = 1e-6
    h = 1e-6
    pi = z.softmax(-1)
    z_h = z + h * (torch.nn.functional.one_hot(y, 5).double() - pi)
    d_h, _ = predictive_divergence(z_h, z_old, y, kind)
    assert_close((d_h.double() - d.double()) / h, s.double(), rtol=1e-4, atol=1e-6)


def topk_inputs(z, z_old, y, k):
    lp, lq = z.log_softmax(-1), z_old.log_softmax(-1)
    ids = lq.topk(k, -1).indices  # the engine exposes mu's top-K
    col = (ids == y.unsqueeze(-1)).long()
    idx = torch.where(col.any(-1), col.argmax(-1), torch.full_like(y, -1))
    return (
        lp.gather(-1, ids),
        lq.gather(-1, ids),
        idx,
        lp.gather(-1, y.unsqueeze(-1)).squeeze(-1),
        lq.gather(-1, y.unsqueeze(-1)).squeeze(-1),
    )


@pytest.mark.parametrize("kind", ["kl", "tv"])
@pytest.mark.parametrize("estimator", ["lumped", "renorm"])
def test_topk_estimate_converges_as_k_grows(kind, estimator, record_result):
    g = torch.Generator().manual_seed(1)
    V = 64
    z = 2.0 * torch.randn(64, V, generator=g, dtype=torch.float64)  # peaked, LLM-like
    z_old = z + 0.5 * torch.randn(64, V, generator=g, dtype=torch.float64)
    y = torch.multinomial(z_old.softmax(-1), 1, generator=g).squeeze(-1)
    d, s = divergence_and_direction(z.log_softmax(-1), z_old.log_softmax(-1), y, kind)
    errs = []
    for k in (1, 4, 16, 32, V):
        dk, sk = topk_predictive_divergence(*topk_inputs(z, z_old, y, k), kind, estimator)
        errs.append(((sk - s).abs().mean() / s.abs().mean()).item())
        if k == V:
            assert_close(dk, d)  # two statements: assert_close returns None
            assert_close(sk, s)
    # mean |s_K - s| / mean |s| for K = 1, 4, 16, 32, 64, measured:
    # kl lumped 1.24, 0.86, 0.13, 0.013, 0     kl renorm 2.08, 0.90, 0.19, 0.045, 0
    # tv lumped 2.31, 1.33, 0.21, 0.022, 0     tv renorm 3.28, 1.00, 0.19, 0.051, 0
    assert all(a >= b for a, b in itertools.pairwise(errs)), errs
    assert errs[2] < 0.25 and errs[3] < 0.06 and errs[-1] < 1e-10
    rows = [{"divergence": kind, "estimator": estimator, "k": k, "rel_error": e}
            for k, e in zip((1, 4, 16, 32, V), errs, strict=True)]  # fmt: skip
    record_result("divergence_mask_topk", rows, catalog_ids=[PDM_ID], seeds=[1])


def test_mask_rule_and_direction_differs_from_ratio_test():
    # one position, 3 tokens; mu = (0.6, 0.3, 0.1), pi = (0.2, 0.45, 0.35): TV = 0.4 > 0.15
    mu = torch.tensor([0.6, 0.3, 0.1]).log().expand(1, 4, 3)
    pi = torch.tensor([0.2, 0.45, 0.35]).log().expand(1, 4, 3)
    y = torch.tensor([[1, 1, 2, 2]])  # sampled tokens
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    dists = TokenDistributions(pi.clone(), mu.clone(), y)
    logp, old = pi[0].gather(-1, y.T).T, mu[0].gather(-1, y.T).T
    out = CORRECTIONS.build("predictive_divergence_mask", threshold=0.15)(
        RatioInput(logp, old, torch.ones(1, 4), advantages=adv, dists=dists)
    )
    # s = g_y - sum pi g, g = 1/2 pi (sgn - sum sgn pi), sgn = (-1, 1, 1), sum sgn pi = 0.6:
    # g = (-0.16, 0.09, 0.07); sum pi g = 0.0405 - 0.032 + 0.0245 = 0.033
    # y = 1: s = 0.057 > 0; y = 2: s = 0.037 > 0 -> A > 0 grows D (masked), A < 0 kept
    _, s = divergence_and_direction(pi[0], mu[0], y[0], "tv")
    assert_close(s, torch.tensor([0.057, 0.057, 0.037, 0.037]))
    assert_close(out.mask, torch.tensor([[0.0, 1.0, 0.0, 1.0]]))
    assert out.metrics["pdm_outside_frac"] == 1.0


def test_predicted_direction_can_disagree_with_the_ratio_test():
    # pi = (0.145, 0.556, 0.111, 0.188), mu = (0.027, 0.186, 0.043, 0.744), y = 0, A > 0:
    # r = 5.4 > 1, PPO's ratio test says the step moves further away (mask); but
    # g = pi - mu = (0.118, 0.370, 0.068, -0.556), sum pi g = 0.12585, s = -0.00785 < 0:
    # raising pi_0 takes mass from the over-weighted pi_1, so KL(mu || pi) shrinks
    pi = torch.tensor([[0.145, 0.556, 0.111, 0.188]], dtype=torch.float64)
    mu = torch.tensor([[0.027, 0.186, 0.043, 0.744]], dtype=torch.float64)
    y = torch.tensor([0])
    _, s = divergence_and_direction(pi.log(), mu.log(), y, "kl")
    _, s_ref = reference(pi.log(), mu, y, "kl")
    assert_close(s, s_ref)
    assert s.item() == pytest.approx(-0.00785, abs=1e-6)
    out = CORRECTIONS.build("predictive_divergence_mask", divergence="kl", threshold=0.1)(
        RatioInput(
            pi.log()[:, :1],
            mu.log()[:, :1],
            torch.ones(1, 1),
            advantages=torch.tensor([1.0]),
            dists=TokenDistributions(pi.log()[None], mu.log()[None], y[None]),
        )
    )
    assert out.mask.item() == 1.0  # kept: the step lowers the divergence
    assert out.metrics["pdm_ratio_disagree_frac"] == 1.0


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_direction_and_ratio_tests_disagree_on_random_tokens(kind, record_result):
    """On random 4-token distributions (uniform on the simplex, y ~ mu, A = +-1, every
    token past the threshold) the predicted direction of the divergence and PPO's ratio
    test disagree on a share of tokens: the ratio is not the divergence's direction."""
    g = torch.Generator().manual_seed(4)
    N, K = 20_000, 4
    pi, mu = (-torch.rand(2, N, K, generator=g, dtype=torch.float64).log()).unbind(0)
    pi, mu = pi / pi.sum(-1, keepdim=True), mu / mu.sum(-1, keepdim=True)
    y = torch.multinomial(mu, 1, generator=g)
    adv = torch.randint(0, 2, (N, 1), generator=g).double() * 2 - 1
    out = CORRECTIONS.build("predictive_divergence_mask", divergence=kind, threshold=0.0)(
        RatioInput(
            pi.log().gather(-1, y).T,
            mu.log().gather(-1, y).T,
            torch.ones(1, N),
            advantages=adv.T,
            dists=TokenDistributions(pi.log()[None], mu.log()[None], y.T),
        )
    )
    frac = out.metrics["pdm_ratio_disagree_frac"]
    assert out.metrics["pdm_outside_frac"] > 0.999
    assert 0.02 < frac < 0.4, frac
    row = {"divergence": kind, "tokens": N, "ratio_disagree_frac": frac}
    record_result("divergence_mask_vs_ratio", [row], catalog_ids=[PDM_ID], seeds=[4])


def test_recipe_plumbs_token_dists_and_validates_shapes():
    g = torch.Generator().manual_seed(2)
    B, T, V = 4, 5, 6
    z = torch.randn(B, T, V, generator=g)
    z_old = z + torch.randn(B, T, V, generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    d = TokenDistributions.from_logits(z, z_old, y)
    logp = d.logp.gather(-1, y.unsqueeze(-1)).squeeze(-1).clone().requires_grad_(True)
    old = d.old_logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    mask = torch.ones(B, T)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    recipe = get_preset("predictive_divergence_mask").build()
    out = recipe.policy_loss(PolicyBatch(logp, old, adv, mask, token_dists=d))
    (gr,) = torch.autograd.grad(out.loss, logp)
    div, s = predictive_divergence(z, z_old, y, "tv")
    masked = (div > 0.15) & (adv[:, None] * s > 0)
    assert masked.any() and (gr[masked] == 0).all() and (gr[~masked] != 0).all()
    assert out.metrics["pdm_masked_frac"] == pytest.approx(masked.float().mean().item())
    with pytest.raises(ValueError, match=r"needs token_dists: pass PolicyBatch\.token_dists"):
        recipe.policy_loss(PolicyBatch(logp, old, adv, mask))
    with pytest.raises(ValueError, match="dists must be"):
        RatioInput(logp, old, mask, dists=TokenDistributions.from_logits(z[:2], z_old[:2], y[:2]))
    with pytest.raises(ValueError, match="sampled_index"):
        TokenDistributions(d.logp, d.old_logp, y[:, :2])


def test_sampled_index_out_of_range_is_a_clear_error():
    lp = torch.randn(2, 3, 4).log_softmax(-1)
    TokenDistributions(lp, lp, torch.tensor([[-1, 0, 3], [1, 2, 3]]))  # -1 and K - 1 valid
    with pytest.raises(ValueError, match=r"sampled_index must be in \[-1, K\) with K = 4"):
        TokenDistributions(lp, lp, torch.tensor([[0, 4, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"got values in \[-2, 1\]"):
        TokenDistributions(lp, lp, torch.tensor([[0, -2, 1], [0, 0, 0]]))


def test_row_chunking_gives_the_same_mask(monkeypatch):
    # the entry processes [B, T, K] in row chunks to bound its float64 temporaries; the
    # result must not depend on the chunk size (here 1 row per chunk vs one chunk)
    import rlpost.core.ratios.divergence as div_mod

    g = torch.Generator().manual_seed(4)
    B, T, V = 5, 3, 8
    z = 2 * torch.randn(B, T, V, generator=g)
    z_old = z + torch.randn(B, T, V, generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    d = TokenDistributions.from_logits(z, z_old, y)
    logp = d.logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    old = d.old_logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    inp = RatioInput(logp, old, torch.ones(B, T), advantages=torch.randn(B, generator=g), dists=d)
    f = CORRECTIONS.build("predictive_divergence_mask", threshold=0.1)
    whole = f(inp)
    monkeypatch.setattr(div_mod, "CHUNK_ELEMENTS", T * V)  # one row per chunk
    chunked = f(inp)
    assert 0 < whole.mask.sum() < B * T
    assert torch.equal(whole.mask, chunked.mask) and whole.metrics == chunked.metrics


def test_predictive_mask_params_validated():
    from rlpost.core.ratios.divergence import PredictiveMaskParams

    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="threshold must be finite"):
            PredictiveMaskParams(threshold=bad)
    with pytest.raises(ValueError, match="estimator must be"):
        PredictiveMaskParams(estimator="lumpd")
    with pytest.raises(ValueError, match="divergence must be"):
        PredictiveMaskParams(divergence="js")
