import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput

E = math.e


def run(name, log_ratio, adv, mask=None, weights=None, **params):
    """Objective on a batch whose old log-probs are 0, so logp == log_ratio; returns (loss, dL/dlogp)."""
    logp = torch.tensor(log_ratio, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    out = OBJECTIVES.build(name, **params)(
        ObjectiveInput(logp, torch.zeros_like(logp), torch.tensor(adv), mask, weights=weights)
    )
    out.loss.sum().backward()
    return out, logp.grad


def test_ppo_clip_hand_values():
    # ratios e^1 = 2.718, e^0 = 1, e^-1 = 0.368, advantages +1, +1, -1, clip 0.2
    # token 0: min(2.718*1, 1.2*1) = 1.2 (clipped, no grad)
    # token 1: min(1, 1) = 1 (grad = -r A = -1)
    # token 2: A<0: min(0.368*-1, 0.8*-1) = -0.8 (clipped, no grad)
    out, g = run("ppo_clip", [[1.0, 0.0, -1.0]], [[1.0, 1.0, -1.0]])
    assert_close(out.loss, torch.tensor([[-1.2, -1.0, 0.8]]))
    assert_close(g, torch.tensor([[0.0, -1.0, 0.0]]))
    assert out.metrics["clip_frac"] == pytest.approx(2 / 3)


def test_clip_higher_is_asymmetric():
    # DAPO clip 0.2 / 0.28: ratio 1.25 with A>0 is inside [0.8, 1.28] -> unclipped, grad -1.25
    lr = math.log(1.25)
    out, g = run("ppo_clip", [[lr]], [[1.0]], clip_low=0.2, clip_high=0.28)
    assert_close(g, torch.tensor([[-1.25]]))
    out, g = run("ppo_clip", [[lr]], [[1.0]], clip_low=0.2, clip_high=0.2)
    assert_close(g, torch.tensor([[0.0]]))
    assert_close(out.loss, torch.tensor([[-1.2]]))


def test_dual_clip_bounds_negative_advantage_loss():
    # ratio e^2 = 7.39 with A = -1: PPO gives min(-7.39, -1.2) = -7.39; dual clip c=3 -> max(-7.39, -3) = -3
    out, g = run("ppo_clip", [[2.0]], [[-1.0]], dual_clip=3.0)
    assert_close(out.loss, torch.tensor([[3.0]]))
    assert_close(g, torch.tensor([[0.0]]))
    out, g = run("ppo_clip", [[2.0]], [[-1.0]])
    assert_close(out.loss, torch.tensor([[math.exp(2.0)]]))
    assert_close(g, torch.tensor([[math.exp(2.0)]]))  # d(-rA)/dlogp = -rA = e^2


def test_ppo_gradient_matches_analytic_form_on_random_batch():
    torch.manual_seed(0)
    lr = (torch.randn(6, 7) * 0.3).tolist()
    A = torch.randn(6, 1).expand(6, 7).tolist()
    _, g = run("ppo_clip", lr, A, clip_low=0.2, clip_high=0.28)
    r, a = torch.tensor(lr).exp(), torch.tensor(A)
    active = torch.where(a > 0, r < 1.28, r > 0.8)  # unclipped branch is the min
    assert_close(g, torch.where(active, -r * a, torch.zeros_like(r)))


def test_cispo_keeps_gradient_of_clipped_tokens():
    # ratio e^1 clipped to 1.28 but still gets gradient: d/dlogp (-sg(1.28) * A * logp) = -1.28 A
    out, g = run("cispo", [[1.0, 0.0]], [[1.0, -2.0]], clip_high=0.28)
    assert_close(g, torch.tensor([[-1.28, 2.0]]))
    assert_close(out.loss, torch.tensor([[-1.28 * 1.0 * 1.0, 0.0]]))


def test_reinforce_gradient_is_minus_advantage():
    out, g = run("reinforce", [[-0.5, -1.0]], [2.0])  # advantages [B] broadcast
    assert_close(out.loss, torch.tensor([[1.0, 2.0]]))
    assert_close(g, torch.tensor([[-2.0, -2.0]]))


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "reinforce"])
def test_weights_scale_loss_and_gradient(name):
    w = torch.tensor([[2.0, 0.5]])
    out1, g1 = run(name, [[0.1, -0.1]], [[1.0, -1.0]])
    out2, g2 = run(name, [[0.1, -0.1]], [[1.0, -1.0]], weights=w)
    assert_close(out2.loss, out1.loss * w)
    assert_close(g2, g1 * w)


def test_invalid_params_fail_at_build():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        OBJECTIVES.build("ppo_clip", dual_clip=0.5)
