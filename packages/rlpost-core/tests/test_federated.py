"""Federated updates (rlpost.core.federated, catalog 001-07): on IID shards the aggregate
of the clients' updates is the centralised step; compression with error feedback loses
nothing over rounds; stale updates are discounted."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlpost.core.federated import (
    ErrorFeedback,
    aggregate,
    decode,
    dequantize,
    quantize_int8,
    staleness_weight,
    topk_sparsify,
    wire_bytes,
)

D, N, K = 12, 64, 4


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    w_true = torch.randn(D, generator=g, dtype=torch.float64)
    y = x @ w_true + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)
    return x, y


def _grad(w, x, y):
    w = w.detach().requires_grad_(True)
    ((x @ w - y) ** 2).mean().backward()
    return w.grad


def test_fedavg_of_iid_shards_equals_the_centralised_step():
    x, y = _data()
    w0 = torch.zeros(D, dtype=torch.float64)
    lr = 0.1
    shards = [(x[i::K], y[i::K]) for i in range(K)]  # equal-sized IID shards
    deltas = [-lr * _grad(w0, xs, ys) for xs, ys in shards]
    central = -lr * _grad(w0, x, y)
    torch.testing.assert_close(aggregate(deltas, samples=[len(s[0]) for s in shards]), central)


@pytest.mark.parametrize("kind", ["topk", "int8"])
def test_error_feedback_reaches_the_centralised_optimum(kind):
    """Top-25 % sparsified (or int8) updates with error feedback converge to the
    least-squares optimum centralised training reaches. With a constant step, top-k EF
    stays in an O(lr) neighbourhood (each client's gradient is not zero at the optimum,
    only their mean), so the step decays as 1 / sqrt(t)."""
    x, y = _data(1)
    opt = torch.linalg.lstsq(x, y).solution
    shards = [(x[i::K], y[i::K]) for i in range(K)]
    w_f = torch.zeros(D, dtype=torch.float64)
    ef = [ErrorFeedback(kind, ratio=0.25) for _ in range(K)]
    sent_bytes = dense_bytes = 0
    for t in range(1500):
        lr = 0.05 / (1 + t / 100) ** 0.5
        ups = []
        for (xs, ys), e in zip(shards, ef, strict=True):
            sent = e.compress(-lr * _grad(w_f, xs, ys))
            sent_bytes += wire_bytes(sent)
            dense_bytes += D * 8
            ups.append(decode(sent))
        w_f = w_f + aggregate(ups)

    def loss(w):
        return float(((x @ w - y) ** 2).mean())

    assert (w_f - opt).abs().max() < 1e-3
    assert loss(w_f) / loss(opt) - 1 < 1e-3
    assert sent_bytes < 0.5 * dense_bytes  # communication-efficient


def test_error_feedback_loses_nothing_it_only_delays():
    g = torch.Generator().manual_seed(2)
    deltas = [torch.randn(D, generator=g) for _ in range(5)]
    ef = ErrorFeedback("topk", ratio=0.2)
    sent = sum(decode(ef.compress(d)) for d in deltas)
    torch.testing.assert_close(sent + ef.residual, sum(deltas))


def test_compressors_keep_the_largest_entries_and_bound_the_error():
    v = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2])
    s = topk_sparsify(v, 0.4)
    assert sorted(s.indices.tolist()) == [1, 3] and decode(s)[[0, 2, 4]].abs().sum() == 0
    q = quantize_int8(v)
    assert (dequantize(q) - v).abs().max() <= q.scale / 2 + 1e-7
    assert wire_bytes(q) < wire_bytes(v) and wire_bytes(s) < wire_bytes(v)
    with pytest.raises(ValueError, match="ratio"):
        topk_sparsify(v, 0.0)


def test_stale_updates_are_discounted():
    assert staleness_weight(0) == 1.0
    ws = [staleness_weight(s, 0.5) for s in range(6)]
    assert all(a > b for a, b in itertools.pairwise(ws))
    assert staleness_weight(3, 0.0) == 1.0
    u = torch.ones(3)
    assert aggregate([u, u], staleness=[0, 3]).tolist() == pytest.approx([0.75] * 3)
