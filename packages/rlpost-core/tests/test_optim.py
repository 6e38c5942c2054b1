"""Muon and Pion (000-14): spectral behaviour on a constructed matrix, per-head mode,
optimiser steps."""

import itertools

import pytest
import torch

from rlpost.core.optim import Muon, Pion, muon_orthogonalize, pion_cut, pion_filter


def _matrix(sv, rows=64, cols=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(rows, rows, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(cols, cols, generator=g, dtype=torch.float64))
    s = torch.tensor(sv, dtype=torch.float64)
    return U[:, : len(sv)] @ torch.diag(s) @ V[:, : len(sv)].T, U, V


SV = [3.7, 3.3, 2.8, 2.2] + [0.3, 0.18, 0.11, 0.07] * 7  # 4 dominant, 28 noisy tail


def test_pion_keeps_dominant_directions_at_one_and_drives_the_tail_to_zero():
    m, U, V = _matrix(SV)
    sv = torch.linalg.svdvals(pion_filter(m))
    assert (sv[:4] - 1).abs().max() < 1e-3, sv[:4]
    assert sv[4:].max() < 1e-3, sv[4:]
    # the dominant singular directions are kept (not rotated)
    out = pion_filter(m)
    proj = U[:, :4].T @ out @ V[:, :4]
    torch.testing.assert_close(proj, torch.eye(4, dtype=torch.float64), atol=1e-3, rtol=0)


def test_muon_whitens_every_direction_including_the_tail():
    m, _, _ = _matrix(SV)
    sv = torch.linalg.svdvals(muon_orthogonalize(m))
    assert sv.min() > 0.6 and sv.max() < 1.25  # the noisy tail is promoted like the rest


def test_the_cut_follows_promote_steps():
    cuts = [pion_cut(k) for k in range(1, 5)]
    assert all(a > b for a, b in itertools.pairwise(cuts))
    m, _, _ = _matrix([1.0, 0.9 * pion_cut(2) + 0.1, 0.8 * pion_cut(2), 0.05], rows=8, cols=8)
    sv = torch.linalg.svdvals(pion_filter(m, promote_steps=2, suppress_steps=8))
    assert sv[0] > 0.999 and sv[1] > 0.999 and sv[2] < 1e-3 and sv[3] < 1e-3


def test_per_head_mode_equals_applying_it_head_by_head():
    g = torch.Generator().manual_seed(1)
    H, dh, d = 4, 8, 16
    w = torch.randn(H * dh, d, generator=g, dtype=torch.float64)
    w[:dh] *= 10  # heads of very different scale: a joint filter would erase the small ones
    joint = pion_filter(w, heads=H)
    for h in range(H):
        alone = pion_filter(w[h * dh : (h + 1) * dh])  # (float32 inside: matmul order)
        torch.testing.assert_close(joint[h * dh : (h + 1) * dh], alone, atol=1e-6, rtol=1e-5)
    whole = pion_filter(w)
    assert whole[dh:].abs().max() < 0.5 * joint[dh:].abs().max()  # heads 2-4 suppressed
    with pytest.raises(ValueError, match="heads"):
        pion_filter(w, heads=5)


@pytest.mark.parametrize("cls", [Muon, Pion])
def test_optimizers_step_decrease_a_loss_and_round_trip_state(cls):
    torch.manual_seed(0)
    target = torch.randn(16, 8)
    w = torch.nn.Parameter(torch.zeros(16, 8))
    b = torch.nn.Parameter(torch.zeros(8))
    opt = cls([w, b], lr=0.05)
    losses = []
    for _ in range(30):
        loss = ((w - target) ** 2).sum() + ((b - 1) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    sd = opt.state_dict()
    opt2 = cls([w, b], lr=0.05)
    opt2.load_state_dict(sd)
    torch.testing.assert_close(opt2.state[w]["momentum"], opt.state[w]["momentum"])
    with pytest.raises(ValueError, match="lr"):
        cls([w], lr=0)
