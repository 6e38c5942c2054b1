"""UP (catalog 004-15): unclipped anchored positive branch, PPO clip for negatives."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, RATIOS, ObjectiveInput, RatioInput, get_preset

torch.set_num_threads(1)
R = torch.tensor([[0.5, 1.0, 1.5, 3.0]])  # ratios around and far beyond the clip box


def _grad(name, A, log_ratio=None, seq_mean=False, **params):
    old = torch.log(torch.tensor([[0.3, 0.2, 0.1, 0.05]]))
    logp = (old + R.log()).requires_grad_(True)
    m = torch.ones_like(logp)
    lr = None if log_ratio is None else log_ratio(logp, old, m)
    out = OBJECTIVES.build(name, **params)(ObjectiveInput(logp, old, A, m, log_ratio=lr))
    loss = out.loss.mean(1).sum() if seq_mean else out.loss.sum()  # GSPO: per-sequence mean
    (g,) = torch.autograd.grad(loss, logp)
    return g, out


def test_positive_advantages_are_never_clipped():
    A = torch.tensor([2.0])
    g, out = _grad("up", A)
    assert_close(g, torch.full((1, 4), -2.0))  # -A at every ratio, 3.0 included
    assert_close(out.loss.detach(), torch.full((1, 4), -2.0))  # anchored value: A
    g_ppo, _ = _grad("ppo_clip", A, clip_low=0.2, clip_high=0.28)
    assert_close(g_ppo, torch.tensor([[-1.0, -2.0, 0.0, 0.0]]))  # PPO: r > 1.28 -> 0
    assert out.metrics["pos_beyond_clip_frac"] == 0.5


def test_negative_advantages_keep_the_standard_clip():
    A = torch.tensor([-1.0])
    g, _ = _grad("up", A)
    # min(r A, clip(r) A) with A < 0: clipped (0) below 0.8, unclipped (-A r = r) above
    assert_close(g, torch.tensor([[0.0, 1.0, 1.5, 3.0]]))
    g_ppo, _ = _grad("ppo_clip", A, clip_low=0.2, clip_high=0.28)
    assert_close(g, g_ppo)


def test_sequence_level_anchor():
    # GSPO ratio log s = mean_t log r_t, loss averaged per sequence. Positive: -A / |y| per
    # token whatever s. Negative: s = exp((log .5 + 0 + log 1.5 + log 3) / 4) = 1.2247 is
    # above 1 + 4e-4, and with A < 0 that is PPO's unclipped branch: gradient -A s / |y|
    def seq(logp, old, m):
        return RATIOS.build("sequence")(RatioInput(logp, old, m)).log_ratio

    p = {"clip_low": 3e-4, "clip_high": 4e-4}
    g, _ = _grad("up", torch.tensor([1.0]), seq, True, **p)
    assert_close(g, torch.full((1, 4), -0.25))
    g, _ = _grad("up", torch.tensor([-1.0]), seq, True, **p)
    s = R.log().mean().exp()
    assert_close(g, torch.full((1, 4), 1.0) * s / 4)

    def shifted(c):  # log s = c in value, gradient of the sequence ratio kept
        return lambda *a: (lambda x: x - x.detach() + c)(seq(*a))

    g_lo, _ = _grad("up", torch.tensor([-1.0]), shifted(-0.1), True, **p)
    assert (g_lo == 0).all()  # s = e^-0.1 < 1 - 3e-4 with A < 0: clipped
    g_hi, _ = _grad("up", torch.tensor([-1.0]), shifted(0.1), True, **p)
    assert_close(g_hi, torch.full((1, 4), math.exp(0.1) / 4))  # unclipped: -A s / |y|
    assert get_preset("up_gspo").ratio.name == "sequence"
    assert get_preset("up").ratio.name == "token"


@pytest.mark.parametrize("A", [2.0, -1.0])
def test_huge_log_ratio_gives_finite_loss_and_gradient(A):
    # log r = 100 (exp overflows float32): the positive branch's value is A and its gradient
    # -A; the negative branch is PPO's unclipped -r A, saturated by safe_ratio. Before the
    # fix, exp(100) = inf in the branch torch.where discards gave a 0 * inf = NaN gradient
    x = torch.tensor([[0.0, 100.0]], requires_grad=True)
    z = torch.zeros(1, 2)
    out = OBJECTIVES.build("up")(ObjectiveInput(z, z, torch.tensor([A]), torch.ones(1, 2), x))
    (g,) = torch.autograd.grad(out.loss.sum(), x)
    assert torch.isfinite(out.loss).all() and torch.isfinite(g).all()
    if A > 0:
        assert_close(g, torch.tensor([[-2.0, -2.0]]))
    else:
        assert_close(g[0, 0], torch.tensor(1.0))  # -A r at r = 1


def test_params_share_ppo_validation():
    for name in ("up", "sao"):
        with pytest.raises(ValueError, match="0 <= clip_low < 1"):
            OBJECTIVES.build(name, clip_low=1.0)
        with pytest.raises(ValueError, match="0 <= clip_low < 1"):
            OBJECTIVES.build(name, clip_high=-0.1)
