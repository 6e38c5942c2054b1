"""GAC (000-06): noise-aware SFT/RL mixing controller: direction, range, fixed point, and
the gradient signals against their definitions."""

import math

import numpy as np
import pytest
import torch

from rlpost.core.regularizers import GACController, GACSignals, gac_signals

GAC_ID = "000-06"


def _settled(s: GACSignals, **kw) -> GACController:
    ctl = GACController(**kw)
    for _ in range(200):
        ctl.update(s)
    return ctl


BASE = GACSignals(sft_var=1.0, rl_var=1.0, disagreement=0.5)


@pytest.mark.parametrize(
    "field, sign",
    [("rl_var", +1), ("sft_var", -1), ("disagreement", -1)],
)
def test_weight_moves_in_the_stated_direction(field, sign):
    # from the same settled state, raise one signal: more RL noise -> more SFT weight;
    # more SFT noise or more SFT/RL disagreement -> less SFT weight
    a, b = _settled(BASE), _settled(BASE)
    lam0 = a.lam
    bigger = GACSignals(**{**BASE.__dict__, field: getattr(BASE, field) * 4})
    for _ in range(5):
        a.update(BASE)
        b.update(bigger)
    assert a.lam == pytest.approx(lam0, abs=1e-12)  # unchanged signals: unchanged weight
    assert sign * (b.lam - a.lam) > 0.01, (field, a.lam, b.lam)


def test_fixed_signals_give_the_closed_form_fixed_point():
    # v_sft = 1, v_rl = 3, d = 0: lam* = 3 / 4; prior 0.5 with weight 0.1: 0.9 * 0.75 + 0.05
    s = GACSignals(1.0, 3.0, 0.0)
    ctl = GACController(init=0.2, prior=0.5, prior_weight=0.1, max_step=0.05)
    n_max = math.ceil((0.725 - 0.2) / 0.05)  # 11 bounded steps reach it
    lams = [ctl.update(s) for _ in range(n_max)]
    assert lams[-1] == pytest.approx(0.725, abs=1e-9)
    assert all(abs(b - a) <= 0.05 + 1e-12 for a, b in zip([0.2, *lams], lams, strict=False))
    for _ in range(100):  # and it stays there
        assert ctl.update(s) == pytest.approx(0.725, abs=1e-9)
    # the same point from the other side
    ctl2 = GACController(init=1.0, prior=0.5, prior_weight=0.1)
    assert _settled(s, init=1.0).lam == pytest.approx(0.725, abs=1e-9)
    for _ in range(50):
        ctl2.update(s)
    assert ctl2.lam == pytest.approx(0.725, abs=1e-9)


def test_weight_stays_in_range_and_steps_are_bounded():
    g = torch.Generator().manual_seed(0)
    ctl = GACController(init=0.5, lam_min=0.1, lam_max=0.8, max_step=0.1, smoothing=0.5)
    prev = ctl.lam
    for i in range(500):
        v = (torch.rand(3, generator=g) * 10.0 ** torch.randint(-8, 8, (3,), generator=g)).tolist()
        if i % 50 == 0:
            v = [0.0, 0.0, 0.0]  # degenerate: all zero -> lam* = 1/2
        lam = ctl.update(GACSignals(*v))
        assert 0.1 <= lam <= 0.8
        assert abs(lam - prev) <= 0.1 + 1e-12
        prev = lam
    # the clip is the fixed point when the target lies outside the range
    assert _settled(GACSignals(0.0, 1e6, 0.0), lam_max=0.8).lam == 0.8
    assert _settled(GACSignals(1e6, 0.0, 0.0), lam_min=0.1).lam == 0.1


def test_gac_signals_match_their_definition():
    g = torch.Generator().manual_seed(1)
    S, R = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g) + 0.8
    out = gac_signals(S, R)
    s, r = S.double().numpy(), R.double().numpy()
    vs = np.var(s, axis=0, ddof=1).sum() / 5  # variance of the mean gradient
    vr = np.var(r, axis=0, ddof=1).sum() / 5
    d = max(0.0, ((s.mean(0) - r.mean(0)) ** 2).sum() - vs - vr)
    assert out.sft_var == pytest.approx(vs, rel=1e-12)
    assert out.rl_var == pytest.approx(vr, rel=1e-12)
    assert out.disagreement == pytest.approx(d, rel=1e-12)


def test_disagreement_is_noise_corrected(record_result):
    # E[||gbar_s - gbar_r||^2 - v_s - v_r] = ||mu_sft - mu_rl||^2 (here 4 * 0.5^2 = 1)
    g = torch.Generator().manual_seed(2)
    D, K, n = 4, 4, 4000
    mu_s, mu_r = torch.zeros(D), torch.full((D,), 0.5)
    S = mu_s + 1.0 * torch.randn(n, K, D, generator=g)
    R = mu_r + 2.0 * torch.randn(n, K, D, generator=g)
    raw = torch.stack([((S[i].mean(0) - R[i].mean(0)) ** 2).sum() for i in range(n)])
    sig = [gac_signals(S[i], R[i]) for i in range(n)]
    corrected = raw - torch.tensor([s.sft_var + s.rl_var for s in sig])
    assert raw.mean() > 5.0  # the naive distance is dominated by noise (1 + 20 / 4 = 6)
    assert abs(corrected.mean().item() - 1.0) < 0.15, corrected.mean()
    # with less noise the clip at 0 rarely binds and d itself averages to 1
    S = mu_s + 0.3 * torch.randn(n, K, D, generator=g)
    R = mu_r + 0.3 * torch.randn(n, K, D, generator=g)
    d = torch.tensor([gac_signals(S[i], R[i]).disagreement for i in range(n)])
    assert abs(d.mean().item() - 1.0) < 0.05, d.mean()
    row = {"true_distance": 1.0, "raw_mean": raw.mean().item()}
    row |= {"corrected_mean": corrected.mean().item(), "low_noise_clipped_d_mean": d.mean().item()}
    record_result("gac_properties", [row], catalog_ids=[GAC_ID], seeds=[2])


def test_noisier_rl_gradients_raise_the_sft_weight_end_to_end(record_result):
    g = torch.Generator().manual_seed(3)
    mu = torch.randn(16, generator=g)
    lams = {}
    for noise in (0.5, 4.0):
        ctl = GACController(prior_weight=0.0, max_step=1.0, smoothing=0.0)
        for _ in range(20):
            S = mu + 1.0 * torch.randn(4, 16, generator=g)
            R = mu + noise * torch.randn(4, 16, generator=g)
            ctl.update(gac_signals(S, R))
        lams[noise] = ctl.lam
    # expected lam* = v_rl / (v_rl + v_sft) = noise^2 / (noise^2 + 1): 0.2 and 0.94
    assert lams[0.5] < 0.45 < 0.8 < lams[4.0], lams
    rows = [{"rl_noise": k, "sft_noise": 1.0, "lam": v} for k, v in lams.items()]
    record_result("gac_properties", rows, catalog_ids=[GAC_ID], seeds=[3])


def test_mix_and_validation():
    ctl = GACController(init=0.25)
    assert ctl.mix(torch.tensor(4.0), torch.tensor(8.0)).item() == 7.0
    with pytest.raises(ValueError, match="lam_min"):
        GACController(lam_min=0.6, lam_max=0.5)
    with pytest.raises(ValueError, match="K >= 2"):
        gac_signals(torch.zeros(1, 3), torch.zeros(1, 3))


def test_state_dict_round_trip_continues_the_same_trajectory():
    # a resumed controller must continue exactly: same lam *and* same smoothed signals, so
    # the next updates (with new signals) agree; comparing lam alone would miss the EMA
    ctl = GACController(init=0.2)
    for _ in range(3):
        ctl.update(BASE)
    resumed = GACController(init=0.9)
    resumed.load_state_dict(ctl.state_dict())
    lam_only = GACController(init=ctl.lam)  # what restoring lam without the EMA gives
    nxt = GACSignals(sft_var=0.1, rl_var=5.0, disagreement=0.0)
    want = [ctl.update(nxt) for _ in range(20)]
    assert [resumed.update(nxt) for _ in range(20)] == want
    assert [lam_only.update(nxt) for _ in range(20)] != want
