import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import CORRECTIONS, RATIOS, RatioInput

MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_token_ratio_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -9.0]])
    out = RATIOS.build("token")(RatioInput(logp, old, MASK))
    assert_close(out.log_ratio, torch.tensor([[0.5, 0.0, 0.0]]))  # padded token -> 0
    out.log_ratio.sum().backward()
    assert_close(logp.grad, MASK)


def test_sequence_ratio_gspo_length_normalised():
    # log s = mean over the 2 valid tokens of (0.5, 0.0) = 0.25, broadcast to valid tokens
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, -9.0]])
    out = RATIOS.build("sequence")(RatioInput(logp, old, MASK))
    assert_close(out.log_ratio, torch.tensor([[0.25, 0.25, 0.0]]))
    assert out.metrics["ratio_mean"] == pytest.approx(math.exp(0.25))
    # d(sum_t log s * m_t)/d logp_j = |y| * (1/|y|) = 1 for valid j
    out.log_ratio[:, 0].sum().backward()
    assert_close(logp.grad, torch.tensor([[0.5, 0.5, 0.0]]))


@pytest.mark.parametrize("name", ["tis", "mis"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_correction_is_identity_when_engines_agree(name, level):
    old = torch.randn(3, 4)
    mask = torch.tensor([[1.0] * 4, [1.0] * 2 + [0.0] * 2, [1.0, 0, 0, 0]])
    out = CORRECTIONS.build(name, level=level)(
        RatioInput(old.clone(), old, mask, rollout_logp=old.clone())
    )
    assert_close(out.weights, mask)
    assert_close(out.mask, mask)


def test_tis_truncates_token_and_sequence():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    # engine log-probs: ratio pi_old/pi_rollout = e^1 = 2.72 (capped to 2), e^-1 = 0.37, e^0.5 (padded)
    rollout = torch.tensor([[-1.0, 1.0, -0.5]])
    tok = CORRECTIONS.build("tis", cap=2.0)(RatioInput(old, old, MASK, rollout))
    assert_close(tok.weights, torch.tensor([[2.0, math.exp(-1.0), 0.0]]))
    # sequence: product over valid tokens = e^(1 - 1) = 1 -> weight 1 on valid tokens
    seq = CORRECTIONS.build("tis", cap=2.0, level="sequence")(RatioInput(old, old, MASK, rollout))
    assert_close(seq.weights, torch.tensor([[1.0, 1.0, 0.0]]))


def test_mis_masks_out_of_range_tokens():
    old = torch.zeros(1, 3)
    rollout = torch.tensor([[-1.0, -0.1, 0.0]])  # ratios e^1 (out of [0.5, 2]), e^0.1, 1
    out = CORRECTIONS.build("mis", cap=2.0)(RatioInput(old, old, torch.ones(1, 3), rollout))
    assert_close(out.mask, torch.tensor([[0.0, 1.0, 1.0]]))
    assert_close(out.weights, torch.tensor([[0.0, math.exp(0.1), 1.0]]))
    assert out.metrics["is_masked_frac"] == pytest.approx(1 / 3)


def test_correction_requires_rollout_logp():
    with pytest.raises(ValueError, match="rollout_logp"):
        CORRECTIONS.build("tis")(RatioInput(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)))


def test_params_validate_literals_and_finiteness_at_construction():
    # Registry.build checks Literal fields, but a params object built directly must too
    from rlpost.core.ratios.corrections import ClippedISParams, FTISParams, TISParams

    with pytest.raises(ValueError, match=r"TISParams\.level must be one of"):
        TISParams(level="seq")
    with pytest.raises(ValueError, match=r"FTISParams\.filter_level must be one of"):
        FTISParams(filter_level="tokens")
    with pytest.raises(ValueError, match=r"ClippedISParams\.level must be one of"):
        ClippedISParams(level="Token")
    with pytest.raises(ValueError, match=r"FTISParams\.cap must be finite"):
        FTISParams(cap=float("inf"))
    with pytest.raises(ValueError, match=r"TISParams\.cap must be finite"):
        TISParams(cap=float("nan"))


def test_sequence_ratio_ignores_inf_padding():
    logp = torch.tensor([[-1.0, -0.5, -float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.2, -0.4, -float("inf")]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    lr = RATIOS.build("sequence")(RatioInput(logp, old, mask)).log_ratio
    assert_close(lr.detach(), torch.tensor([[0.05, 0.05, 0.0]]))  # (0.2 - 0.1) / 2
    (g,) = torch.autograd.grad(lr.sum(), logp)
    assert_close(g, torch.tensor([[1.0, 1.0, 0.0]]))  # 2 tokens x 1/2 each
