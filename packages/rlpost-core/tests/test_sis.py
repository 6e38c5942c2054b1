"""SIS (catalog 004-17): token-level rejection test; accepted tokens weight 1, rejected
tokens keep the standard IS weight (the default, lower variance than plain IS); the
``"unbiased"`` variant rescales the rejected weight so that it is unbiased under the
proposal."""

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import CORRECTIONS, RatioInput, get_preset

torch.set_num_threads(1)

# proposal q (the policy that sampled) and target pi (current policy) on 5 tokens
Q = torch.tensor([0.40, 0.25, 0.20, 0.10, 0.05], dtype=torch.float64)
PI = torch.tensor([0.15, 0.30, 0.20, 0.05, 0.30], dtype=torch.float64)  # rho up to 6
SIS_ID = "004-17"


def sample(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(Q, n, replacement=True, generator=g).view(-1, 100)
    return y, RatioInput(PI.log()[y], Q.log()[y], torch.ones(y.shape, dtype=torch.float64))


def test_conditional_expectation_equals_rho():
    # E[w | y] = a + (1 - a) w_rej = rho(y) for every y and M (a = min(1, rho) / M):
    # 200k replicas of each rho, the mean weight within 4 standard errors of rho
    rho = torch.tensor([0.01, 0.3, 1.0, 1.7, 6.0], dtype=torch.float64)
    n = 200_000
    lr = rho.log().repeat_interleave(n).view(5, n)
    inp = RatioInput(lr, torch.zeros_like(lr), torch.ones_like(lr))
    for M in (1.5, 2.0, 8.0):
        w = CORRECTIONS.build("sis", envelope=M, rejected_weight="unbiased", seed=int(M * 10))(
            inp
        ).weights
        se = w.std(1) / n**0.5
        assert ((w.mean(1) - rho).abs() <= 4 * se + 1e-12).all()
        # two values per token: 1 (accepted) and the rejected weight, bounded by rho M/(M-1)
        assert (w.max(1).values <= torch.maximum(rho * M / (M - 1), torch.ones(5)) + 1e-12).all()
        acc = (w == 1.0).double().mean(1)
        a = rho.clamp(max=1) / M
        assert ((acc - a).abs()[rho != 1] < 0.005).all()


def test_expected_weight_unbiased_under_the_proposal(record_result):
    y, inp = sample(200_000)
    out = CORRECTIONS.build("sis", envelope=2.0, rejected_weight="unbiased", seed=3)(inp)
    w = out.weights
    # E_q[w] = 1 and E_q[w f(y)] = E_pi[f] (f = one-hot of each token): measured within
    # 3 standard errors
    se = w.std() / w.numel() ** 0.5
    assert abs(w.mean().item() - 1.0) < 3 * se.item()  # measured 0.9943, se 0.0037
    for v in range(5):
        f = (y == v).double()
        est = (w * f).mean()
        se_v = (w * f).std() / w.numel() ** 0.5
        assert abs(est.item() - PI[v].item()) < 3.5 * se_v.item()
    # accepted tokens have unit weight; the expected acceptance is E_q[min(1, rho)] / M
    acc = out.metrics["sis_accept_frac"]
    assert acc == pytest.approx(
        torch.minimum(Q, PI).sum().item() / 2, abs=0.005
    )  # 0.35 (measured 0.351)
    row = {"variant": "unbiased", "mean_weight": w.mean().item(), "mean_weight_se": se.item()}
    row |= {"accept_frac": acc, "accept_frac_exact": torch.minimum(Q, PI).sum().item() / 2}
    record_result("sis_weights", [row], catalog_ids=[SIS_ID], seeds=[3])


def test_default_weight_has_lower_variance_than_plain_token_is(record_result):
    # the abstract's rule (the default): rejected tokens keep rho, accepted ones get 1;
    # on the simulated mismatch (rho up to 6) the per-token weight variance falls below
    # plain token-level IS (measured 0.75 vs 1.44), the rescaled unbiased variant's rises
    _, inp = sample(200_000)
    rho = (inp.logp - inp.old_logp).exp()
    plain = rho.var().item()
    w = CORRECTIONS.build("sis", envelope=2.0, seed=3)(inp).weights
    unbiased = CORRECTIONS.build("sis", envelope=2.0, rejected_weight="unbiased", seed=3)(inp)
    assert plain == pytest.approx(1.44, abs=0.05)
    assert w.var().item() < 0.6 * plain
    assert unbiased.weights.var().item() > plain
    rows = [{"variant": "plain token IS", "weight_var": plain}]
    rows += [{"variant": "ratio (default)", "weight_var": w.var().item()}]
    rows += [{"variant": "unbiased", "weight_var": unbiased.weights.var().item()}]
    record_result("sis_weights", rows, catalog_ids=[SIS_ID], seeds=[3])


def test_literal_ratio_weight_is_biased(record_result):
    # the abstract's literal rejected weight rho: E[w | y] = a + (1 - a) rho != rho;
    # here E_q[w] = 0.909 in closed form instead of 1
    _, inp = sample(200_000)
    w = CORRECTIONS.build("sis", envelope=2.0, seed=3)(inp).weights  # default "ratio"
    rho = PI / Q
    a = rho.clamp(max=1) / 2
    exact = (Q * (a + (1 - a) * rho)).sum().item()
    assert exact == pytest.approx(0.9094, abs=1e-3)
    assert w.mean().item() == pytest.approx(exact, abs=0.015)
    row = {"variant": "ratio (default)", "mean_weight": w.mean().item(), "exact": exact}
    record_result("sis_weights", [row], catalog_ids=[SIS_ID], seeds=[3])


def test_on_policy_tokens_and_padding():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = CORRECTIONS.build("sis", seed=0)(RatioInput(logp, logp, mask))
    # rho = 1: accepted -> 1, rejected -> rho = 1 (and (1 - 1/2) / (1 - 1/2) = 1 unbiased)
    assert_close(out.weights, mask)
    # rollout_logp, when given, is the proposal
    out = CORRECTIONS.build("sis", seed=0)(RatioInput(logp, logp - 5.0, mask, rollout_logp=logp))
    assert_close(out.weights, mask)


def test_seed_reproducible_and_preset():
    _, inp = sample(1000)
    a = CORRECTIONS.build("sis", seed=7)(inp).weights
    b = CORRECTIONS.build("sis", seed=7)(inp).weights
    assert torch.equal(a, b)
    p = get_preset("sis")
    assert p.correction.name == "sis" and p.objective.name == "reinforce"
    with pytest.raises(ValueError, match="envelope"):
        CORRECTIONS.build("sis", envelope=1.0)


def test_fixed_seed_draws_fresh_uniforms_for_new_inputs():
    # a fixed seed reproduces a call on the same inputs, but a new batch (or an updated
    # policy) gets new uniforms: the acceptance pattern is not frozen across steps
    _, inp = sample(2000)
    f = CORRECTIONS.build("sis", seed=7)
    a = f(inp).weights
    shifted = RatioInput(inp.logp + 1e-3, inp.old_logp + 1e-3, inp.mask)  # same rho
    b = f(shifted).weights
    assert torch.equal(a, f(inp).weights)
    same = (a == b).float().mean().item()
    assert same < 0.9, same  # measured 0.42 (a fixed draw would give 1.0)


def test_sis_params_validated_at_construction():
    from rlpost.core.ratios.corrections import SISParams

    with pytest.raises(ValueError, match="envelope must be finite"):
        SISParams(envelope=float("inf"))
    with pytest.raises(ValueError, match="rejected_weight must be one of"):
        SISParams(rejected_weight="unbiassed")
