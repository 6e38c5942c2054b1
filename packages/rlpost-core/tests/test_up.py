"""UP (catalog 004-15): unclipped anchored positive branch, PPO clip for negatives."""

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
    g_lo, _ = _grad("up", torch.tensor([-1.0]), lambda *a: seq(*a) * 0 - 0.1, True, **p)
    assert (g_lo == 0).all()  # s = e^-0.1 < 1 - 3e-4 with A < 0: clipped
    assert get_preset("up_gspo").ratio.name == "sequence"
    assert get_preset("up").ratio.name == "token"
