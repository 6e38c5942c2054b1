"""CTPO (catalog 001-09): cumulative token IS ratio with sqrt(t)-scaled log-space clipping."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, RATIOS, ObjectiveInput, PolicyBatch, RatioInput, get_preset

torch.set_num_threads(1)


def test_cumulative_ratio_is_prefix_product_skipping_masked_tokens():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 6, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(2, 6, generator=g, dtype=torch.float64)
    # row 0: a masked tool-output span at t = 2, 3; row 1: right padding after 4 tokens
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.float64)
    out = RATIOS.build("cumulative")(RatioInput(logp.requires_grad_(True), old, mask))
    r = torch.where(mask > 0, (logp.detach() - old).exp(), torch.ones_like(old))
    expected = torch.cumprod(r, 1) * mask  # independent form: product of token ratios
    assert_close(out.log_ratio.detach().exp() * mask, expected)
    assert (out.log_ratio[mask == 0] == 0).all()


@pytest.mark.parametrize("detach_prefix", [True, False])
def test_cumulative_ratio_jacobian(detach_prefix):
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.9, -0.4, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    lr = RATIOS.build("cumulative", detach_prefix=detach_prefix)(RatioInput(logp, old, mask))
    jac = torch.stack(
        [torch.autograd.grad(lr.log_ratio[0, t], logp, retain_graph=True)[0][0] for t in range(4)]
    )
    # d log R_t / d log pi(y_s): delta_st (token-level PG term), or 1[s <= t] (full product)
    tri = torch.tril(torch.ones(4, 4)) if not detach_prefix else torch.eye(4)
    tri[:, 3] = 0
    tri[3] = 0
    assert_close(jac, tri)


def test_cumulative_ratio_variance_below_full_sequence_ratio():
    # token log-ratios iid N(-s^2/2, s^2) under pi_old, so E[r] = 1 and
    # Var(R_t) = exp(t s^2) - 1, strictly increasing in t: every prefix ratio has a lower
    # variance than the full-sequence ratio R_T
    g = torch.Generator().manual_seed(0)
    n, T, s = 100_000, 16, 0.2
    tok = -(s**2) / 2 + s * torch.randn(n, T, generator=g, dtype=torch.float64)
    old = torch.zeros(n, T, dtype=torch.float64)
    R = RATIOS.build("cumulative")(RatioInput(tok, old, torch.ones(n, T))).log_ratio.exp()
    var = R.var(0)
    full = var[-1]
    assert (var[:-1] < full).all()
    assert var.mean() < 0.55 * full  # measured 0.472 (exact: 0.478)
    theory = torch.tensor([math.exp((t + 1) * s * s) - 1 for t in range(T)], dtype=torch.float64)
    assert_close(var, theory, rtol=0.08, atol=0.0)
    assert_close(R.mean(0), torch.ones(T, dtype=torch.float64), rtol=0.02, atol=0.0)


def test_ctpo_clip_bound_widens_as_sqrt_t():
    # one response, A = +1, every token with cumulative log-ratio 0.3; eps = 0.2:
    # bounds 0.2 sqrt(t) = 0.2, 0.283, 0.346, 0.4 -> only t = 1, 2 are clipped
    lr = torch.full((1, 4), 0.3, requires_grad=True)
    logp = torch.zeros(1, 4)
    out = OBJECTIVES.build("ctpo_clip", clip_low=0.2, clip_high=0.2)(
        ObjectiveInput(logp, logp, torch.tensor([1.0]), torch.ones(1, 4), log_ratio=lr)
    )
    e = math.exp(0.3)
    expected = -torch.tensor([[math.exp(0.2), math.exp(0.2 * math.sqrt(2)), e, e]])
    assert_close(out.loss.detach(), expected)
    (g,) = torch.autograd.grad(out.loss.sum(), lr)
    assert_close(g, torch.tensor([[0.0, 0.0, -e, -e]]))  # d(-R A)/d log R = -R
    assert out.metrics["clip_frac"] == pytest.approx(0.5)


def test_ctpo_clip_negative_advantage_clips_low_side():
    # A = -1, log R = -0.5 at t = 4: bound -0.4 -> pessimistic min picks the clipped value
    lr = torch.tensor([[0.0, 0.0, 0.0, -0.5]], requires_grad=True)
    z = torch.zeros(1, 4)
    out = OBJECTIVES.build("ctpo_clip")(
        ObjectiveInput(z, z, torch.tensor([-1.0]), torch.ones(1, 4), log_ratio=lr)
    )
    assert out.loss[0, 3].item() == pytest.approx(math.exp(-0.4))
    (g,) = torch.autograd.grad(out.loss.sum(), lr)
    assert g[0, 3] == 0


def test_ctpo_preset_step():
    recipe = get_preset("ctpo").build()
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(4, 8, generator=g)).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(4, 8, generator=g)
    mask = (torch.arange(8) < torch.tensor([8, 5, 3, 8])[:, None]).float()
    loss = recipe.policy_loss(
        PolicyBatch(logp, old, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask)
    ).loss
    (gr,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(gr).all() and (gr[mask == 0] == 0).all()


def test_ctpo_clip_equals_independent_log_space_form():
    # ctpo_clip now delegates to clipped_surrogate with bounds exp(+-eps sqrt t); compare
    # with the log-space definition min(R A, exp(clip(log R, -eps_lo sqrt t, eps_hi sqrt t)) A)
    g = torch.Generator().manual_seed(3)
    lr = (0.6 * torch.randn(3, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = (torch.arange(7) < torch.tensor([7, 4, 6])[:, None]).double()
    mask[0, 2] = 0.0
    A = torch.tensor([1.0, -1.0, 0.7], dtype=torch.float64)
    z = torch.zeros(3, 7, dtype=torch.float64)
    out = OBJECTIVES.build("ctpo_clip", clip_low=0.15, clip_high=0.25)(
        ObjectiveInput(z, z, A, mask, log_ratio=lr)
    )
    sq = mask.cumsum(1).clamp_min(1.0).sqrt()
    x = lr * mask
    J = torch.minimum(x.exp() * A[:, None], x.clamp(-0.15 * sq, 0.25 * sq).exp() * A[:, None])
    ref = -J * mask
    assert_close(out.loss, ref)
    (g1,) = torch.autograd.grad(out.loss.sum(), lr)
    (g2,) = torch.autograd.grad(ref.sum(), lr)
    assert_close(g1, g2)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ctpo_long_response_cumulative_ratio_stays_finite(sign):
    # 2000 tokens with token log-ratio 0.1: the cumulative log-ratio reaches 200, far past
    # float32's exp overflow (88.7); before safe_ratio: A > 0 gave a NaN gradient
    # (0 * inf in the discarded branch), A < 0 an infinite loss
    T = 2000
    old = torch.full((1, T), -2.0)
    logp = (old + 0.1).requires_grad_(True)
    recipe = get_preset("ctpo").build()
    loss = recipe.policy_loss(PolicyBatch(logp, old, torch.tensor([sign]), torch.ones(1, T)))
    (gr,) = torch.autograd.grad(loss.loss, logp)
    assert torch.isfinite(loss.loss) and torch.isfinite(gr).all()
    assert all(math.isfinite(v) for v in loss.metrics.values()), loss.metrics


def test_cumulative_ratio_ignores_inf_log_probs_of_masked_span():
    # a masked tool output whose log-probs are -inf must not reach the later valid tokens
    logp = torch.tensor([[-1.0, -float("inf"), -0.5, -0.7]], requires_grad=True)
    old = torch.tensor([[-1.2, -float("inf"), -0.4, -0.9]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    lr = RATIOS.build("cumulative")(RatioInput(logp, old, mask)).log_ratio
    assert_close(lr.detach(), torch.tensor([[0.2, 0.0, 0.1, 0.3]]))
    (g,) = torch.autograd.grad(lr.sum(), logp)
    assert_close(g, torch.tensor([[1.0, 0.0, 1.0, 1.0]]))


def test_ctpo_clip_params_must_be_finite():
    with pytest.raises(ValueError, match="clip_high must be finite"):
        OBJECTIVES.build("ctpo_clip", clip_high=float("inf"))
    with pytest.raises(ValueError, match="clip_low must be finite"):
        OBJECTIVES.build("ctpo_clip", clip_low=float("nan"))
