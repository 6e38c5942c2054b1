"""RIPO (catalog 004-08): a Fisher-Rao trust region instead of PPO's Euclidean ratio box."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput
from rlpost.core.objectives.offpolicy import fisher_rao_ratio_bounds

torch.set_num_threads(1)
P = torch.tensor([[1e-3, 0.01, 0.2, 0.5, 0.8]], dtype=torch.float64)


def fisher_rao(p, q):
    """Fisher-Rao distance between Bernoulli(p) and Bernoulli(q): 2 arccos(Bhattacharyya)."""
    bc = (p * q).sqrt() + ((1 - p) * (1 - q)).sqrt()
    return 2 * torch.arccos(bc.clamp(max=1.0))


def test_allowed_update_is_the_same_fisher_rao_ball_for_every_probability():
    delta = 0.1
    lo, hi = fisher_rao_ratio_bounds(P.log(), delta)
    # every boundary lies at distance 2 delta, except that p = 0.001 (arcsin sqrt p =
    # 0.0316 < delta) may go down to 0
    assert_close(fisher_rao(P, P * hi), torch.full_like(P, 2 * delta))
    assert_close(fisher_rao(P, P * lo)[0, 1:], torch.full((4,), 2 * delta, dtype=P.dtype))
    assert lo[0, 0] == 0.0
    # PPO's box |r - 1| <= 0.2 (the same width at p = 1/2): up-moves of Fisher-Rao length
    # 0.0060, 0.0192, 0.0967, 0.2014, 0.5246 for p = 0.001, 0.01, 0.2, 0.5, 0.8 (down-moves
    # 0.0067 ... 0.3597): 87x apart, against 2 delta = 0.2 for all of them under RIPO
    d_ppo = fisher_rao(P, (P * 1.2).clamp(max=1.0))
    assert d_ppo.max() / d_ppo.min() > 50
    assert d_ppo[0, 0] < 0.05 * 2 * delta and d_ppo[0, 4] > 2.5 * 2 * delta
    # delta = 0.1 gives PPO's upper bound 1 + sin(0.2) = 1.1987 at p = 1/2
    assert hi[0, 3].item() == pytest.approx(1 + math.sin(0.2))
    # at the edges: p' is clamped to [0, 1]
    lo2, hi2 = fisher_rao_ratio_bounds(torch.tensor([[1e-4, 0.999]]).log(), delta)
    assert lo2[0, 0] == 0.0 and hi2[0, 1] == pytest.approx(1 / 0.999)


def test_gradient_low_vs_high_probability_tokens():
    # A = +1. Rare token p = 0.01 at r = 3: RIPO's box reaches sin^2(asin(0.1) + 0.1) / 0.01
    # = 3.953, unclipped -> gradient -r A = -3; PPO (0.2) clipped -> 0.
    # Likely token p = 0.9 at r = 1.06: RIPO's box ends at sin^2(asin(0.9487) + 0.1) / 0.9
    # = 1.0573 -> clipped, 0; PPO keeps -1.06.
    old = torch.log(torch.tensor([[0.01, 0.9]]))
    r = torch.tensor([[3.0, 1.06]])
    logp = (old + r.log()).requires_grad_(True)
    inp = ObjectiveInput(logp, old, torch.tensor([1.0]), torch.ones(1, 2))
    out = OBJECTIVES.build("ripo", delta=0.1)(inp)
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(g, torch.tensor([[-3.0, 0.0]]))
    (g_ppo,) = torch.autograd.grad(OBJECTIVES.build("ppo_clip")(inp).loss.sum(), logp)
    assert_close(g_ppo, torch.tensor([[0.0, -1.06]]))
    _, hi = fisher_rao_ratio_bounds(old, 0.1)
    assert_close(hi, torch.tensor([[3.9534, 1.0573]]), atol=1e-4, rtol=0)
    assert out.metrics["clip_frac"] == 0.5
