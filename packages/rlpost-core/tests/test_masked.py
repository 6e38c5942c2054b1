"""Masked reductions ignore whatever padding holds; group_sum matches a per-group loop."""

import math

import torch

from rlpost.core.masked import group_sum, masked_mean, masked_sum, masked_var, masked_whiten


def _padded(fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[1.0, 2.0, fill], [3.0, fill, fill]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    return x, mask


def test_masked_reductions_ignore_inf_and_nan_padding() -> None:
    for fill in (-math.inf, math.inf, math.nan):
        x, mask = _padded(fill)
        # rows: mean(1, 2) = 1.5 and mean(3) = 3; sum = 6; var(1, 2, 3) = 1
        torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))
        torch.testing.assert_close(masked_sum(x, mask), torch.tensor(6.0))
        torch.testing.assert_close(masked_var(x, mask), torch.tensor(1.0))
        w = masked_whiten(x, mask)
        assert torch.isfinite(w).all() and (w[mask == 0] == 0).all()
        loss = masked_mean(x, mask, dim=1).sum() + masked_var(x, mask) + w.sum()
        loss.backward()
        assert torch.isfinite(x.grad).all(), fill
        assert (x.grad[mask == 0] == 0).all(), fill
        # d/dx of mean(row) is 1/n_valid; var(1,2,3) grad is 2 (x - 2) / 2 = x - 2; whiten
        # sums to 0 over valid entries, so its gradient vanishes
        torch.testing.assert_close(
            x.grad[mask == 1], torch.tensor([0.5 - 1.0, 0.5 + 0.0, 1.0 + 1.0])
        )


def test_group_sum_matches_loop_keeps_dtype_and_shape() -> None:
    torch.manual_seed(0)
    ids = torch.tensor([7, 3, 7, 7, 3, 9])
    v = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    out = group_sum(v, ids)
    want = torch.stack([v[ids == i].sum(0) for i in ids.tolist()])
    torch.testing.assert_close(out, want)
    assert out.dtype == torch.float64 and out.shape == v.shape
    out[0, 0].backward()  # group 7 = rows 0, 2, 3
    assert v.grad[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(group_sum(torch.ones(3), None), torch.full((3,), 3.0))


def test_group_sum_on_meta_device_stays_there() -> None:
    out = group_sum(torch.empty(5, 2, device="meta"), None)
    assert out.device.type == "meta" and out.shape == (5, 2)
