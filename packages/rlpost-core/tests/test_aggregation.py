import pytest
import torch
from torch.testing import assert_close

from rlpost.core import AGGREGATIONS, AggregationInput

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("token_mean", {}, (1 + 2 + 3 + 4) / 4),  # 4 valid tokens
        ("seq_mean_token_sum", {}, ((1 + 2 + 3) + 4) / 2),
        ("seq_mean_token_mean", {}, ((1 + 2 + 3) / 3 + 4 / 1) / 2),
        ("constant", {"normalizer": 10.0}, (1 + 2 + 3 + 4) / (2 * 10)),
    ],
)
def test_hand_values(name, params, expected):
    out = AGGREGATIONS.build(name, **params)(AggregationInput(LOSS, MASK))
    assert out.loss.item() == pytest.approx(expected)


def test_constant_defaults_to_the_generation_budget_it_declares():
    f = AGGREGATIONS.build("constant")  # Dr. GRPO: C = the trainer's max new tokens
    with pytest.raises(ValueError, match="needs generation_budget"):
        f(AggregationInput(LOSS, MASK))
    out = f(AggregationInput(LOSS, MASK, generation_budget=10.0))
    assert out.loss.item() == pytest.approx((1 + 2 + 3 + 4) / (2 * 10))


MODES = [
    ("token_mean", {}),
    ("seq_mean_token_sum", {}),
    ("seq_mean_token_mean", {}),
    ("constant", {"normalizer": 7.0}),
]


@pytest.mark.parametrize(("name", "params"), MODES)
def test_gradient_accumulation_equals_full_batch(name, params):
    """Sum of micro-batch gradients (global counts) == full-batch gradient, uneven splits."""
    torch.manual_seed(0)
    B, T = 7, 9
    lengths = torch.tensor([9, 1, 4, 7, 2, 9, 5])
    mask = (torch.arange(T) < lengths[:, None]).float()
    x = torch.randn(B, T, requires_grad=True)
    agg = AGGREGATIONS.build(name, **params)

    def tok_loss(z):
        return (z**2) * 0.5 + z

    full = agg(AggregationInput(tok_loss(x), mask)).loss
    (g_full,) = torch.autograd.grad(full, x)
    g_acc = torch.zeros_like(x)
    total = torch.zeros(())
    n_tok, n_seq = mask.sum().item(), B
    for idx in ([0, 1, 2], [3], [4, 5, 6]):
        xi = x.detach()[idx].clone().requires_grad_(True)
        li = agg(
            AggregationInput(tok_loss(xi), mask[idx], global_tokens=n_tok, global_sequences=n_seq)
        ).loss
        li.backward()
        g_acc[idx] += xi.grad
        total += li.detach()
    assert_close(total, full.detach())
    assert_close(g_acc, g_full)


@pytest.mark.parametrize(("name", "params"), MODES)
def test_masked_tokens_get_zero_gradient(name, params):
    x = torch.randn(2, 3, requires_grad=True)
    AGGREGATIONS.build(name, **params)(AggregationInput(x * 3.0, MASK)).loss.backward()
    assert (x.grad[MASK == 0] == 0).all()
    assert (x.grad[MASK == 1] != 0).all()


def test_all_masked_is_finite():
    out = AGGREGATIONS.build("seq_mean_token_mean")(AggregationInput(LOSS, torch.zeros(2, 3)))
    assert out.loss.item() == 0.0


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_count_scale_defers_the_normaliser_of_every_entry(name):
    """RolloutPipe back-propagates chunks with unit global counts and rescales the summed
    gradient once: exact only if every entry is (local sum) / f(global counts)."""
    from rlpost.core.aggregation import count_scale

    torch.manual_seed(0)
    agg = AGGREGATIONS.build(name)
    parts = [
        (torch.randn(3, 5, dtype=torch.float64, requires_grad=True), torch.rand(3, 5) > 0.3),
        (torch.randn(2, 4, dtype=torch.float64, requires_grad=True), torch.rand(2, 4) > 0.5),
    ]
    tokens = float(sum(m.sum() for _, m in parts))
    seqs = float(sum((m.sum(1) > 0).sum() for _, m in parts))
    budget = 6.0
    full = sum(agg(AggregationInput(x, m.double(), tokens, seqs, budget)).loss for x, m in parts)
    gx = torch.autograd.grad(full, [x for x, _ in parts])
    unit = sum(agg(AggregationInput(x, m.double(), 1.0, 1.0, budget)).loss for x, m in parts)
    gu = torch.autograd.grad(unit, [x for x, _ in parts])
    s = count_scale(agg, tokens, seqs, budget)
    assert s != 1.0  # the counts matter
    assert_close(unit * s, full)
    for a, b in zip(gu, gx, strict=True):
        assert_close(a * s, b)
