"""MXFP4 fake quantisation (000-13): format, exact three-way error split, corrections."""

import math

import pytest
import torch

from rlpost.kernels.ops.mxfp4 import (
    AdaptiveQuantNoise,
    decompose_mxfp4,
    fake_quant,
    macro_factors,
    round_fp4,
)


def _heavy(rows=8, cols=256, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=dtype)
    return x * torch.exp(torch.randn(rows, cols, generator=g, dtype=dtype))


def test_fp4_rounding_grid_ties_and_saturation():
    v = torch.tensor([0.1, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 9.0, -0.76])
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, -1.0]
    assert round_fp4(v).tolist() == want


def test_block_format_hand_worked():
    x = torch.zeros(32)
    x[0], x[1], x[2] = 5.0, 0.3, -1.2  # amax 5: s = 2^(floor(log2 5) - 2) = 1
    p = decompose_mxfp4(x)
    assert p.q[:3].tolist() == [4.0, 0.5, -1.0]  # 5 -> 4 (tie to even), 0.3 -> 0.5
    # ideal scale 5/6: 0.3 / (5/6) = 0.36 -> 0.5 * 5/6; 5 -> 6 * 5/6 = 5 exactly
    torch.testing.assert_close(p.scale_bias[0], torch.tensor(-1.0))
    torch.testing.assert_close(p.grid[1], torch.tensor(0.5 * 5 / 6 - 0.3))


def _fp4(v: float) -> float:
    """Scalar E2M1 rounding written out: nearest grid value, ties to the even mantissa."""
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(a - grid[i]), i % 2))  # tie: even index
    return math.copysign(grid[best], v) if grid[best] else 0.0


def _scalar_parts(row: list[float], macro: int | None, outliers: int) -> list[tuple]:
    """Per-entry (q, scale_bias, deadzone, grid) of one row, block by block, in plain
    Python floats: an independent reading of the format and of the three error parts."""
    out = []
    blocks = [row[i : i + 32] for i in range(0, len(row), 32)]
    for b, blk in enumerate(blocks):
        r = 1.0
        if macro:
            mb = [
                v for blk2 in blocks[(b // macro) * macro : (b // macro + 1) * macro] for v in blk2
            ]
            m = max(abs(v) for v in mb) or 1.0
            r = m / (6.0 * 2.0 ** math.floor(math.log2(m / 6.0)))
        amax_r = max(abs(v / r) for v in blk) or 1.0
        s = 2.0 ** (math.floor(math.log2(amax_r)) - 2)
        amax = max(abs(v) for v in blk) or 1.0
        s_ideal = amax / 6.0
        ent = []
        for v in blk:
            q = r * s * _fp4(v / r / s)
            ideal = s_ideal * _fp4(v / s_ideal)
            dead = ideal == 0.0
            ent.append([q, q - ideal, -v if dead else 0.0, 0.0 if dead else ideal - v, v])
        if outliers:  # exact value for the largest-error entries; their parts balance to 0
            for e in sorted(ent, key=lambda e: -abs(e[0] - e[4]))[:outliers]:
                e[0], e[1] = e[4], -(e[2] + e[3])
        out.extend(tuple(e[:4]) for e in ent)
    return out


@pytest.mark.parametrize("kw", [{}, {"macro": 8}, {"outliers": 1}, {"macro": 4, "outliers": 3}])
def test_each_error_part_matches_an_independent_scalar_quantiser(kw):
    # not the sum (which holds by construction): each part against a plain-Python
    # element-by-element computation of the format and the decomposition
    x = _heavy(rows=2)
    p = decompose_mxfp4(x, **kw)
    want = [_scalar_parts(row, kw.get("macro"), kw.get("outliers", 0)) for row in x.tolist()]
    for k, name in enumerate(("q", "scale_bias", "deadzone", "grid")):
        ref = torch.tensor([[e[k] for e in row] for row in want], dtype=x.dtype)
        torch.testing.assert_close(getattr(p, name), ref, atol=1e-12, rtol=1e-12, msg=name)
    # the parts live where they should: deadzone only on entries the ideal quantiser zeroes
    dead = p.deadzone != 0
    assert (p.grid[dead] == 0).all() and dead.any() and (p.scale_bias != 0).any()


def test_components_behave_as_named():
    x = _heavy(rows=32)
    p = decompose_mxfp4(x)
    # grid noise is at most half a grid step of the ideal scale (step <= 2 s* at the top)
    s_ideal = x.reshape(32, -1, 32).abs().amax(-1, keepdim=True) / 6
    assert (p.grid.reshape(32, -1, 32).abs() <= s_ideal + 1e-12).all()
    # deadzone entries are the small ones: |x| <= s*/4
    dz = (p.deadzone != 0).reshape(32, -1, 32)
    assert (x.reshape(32, -1, 32).abs()[dz] <= (s_ideal / 4).expand_as(dz)[dz] + 1e-12).all()
    # scale bias comes from rounding the scale to a power of two: where the ideal scale
    # already is one (block maximum exactly 6 * 2^j), it vanishes
    xb = x.reshape(32, -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    aligned = xb / amax * 6 * torch.exp2(torch.randint(-3, 4, amax.shape).double())
    pa = decompose_mxfp4(aligned.reshape(32, -1))
    assert (pa.scale_bias == 0).all() and not (p.scale_bias == 0).all()


def test_corrections_reduce_their_component():
    x = _heavy(rows=64, seed=3)
    base = decompose_mxfp4(x)
    macro = decompose_mxfp4(x, macro=8)
    fallback = decompose_mxfp4(x, outliers=1)

    def mse(t):
        return float((t**2).mean())

    assert mse(macro.scale_bias) < 0.9 * mse(base.scale_bias)
    assert mse(fallback.q - x) < 0.7 * mse(base.q - x)
    # the macro-block maximum is represented exactly
    xb = x.reshape(64, -1, 256)
    qb = macro.q.reshape(64, -1, 256)
    i = xb.abs().argmax(-1, keepdim=True)
    torch.testing.assert_close(qb.gather(-1, i), xb.gather(-1, i))
    r = macro_factors(x.reshape(64, -1, 32), 8)
    assert ((r >= 1) & (r < 2)).all()


def test_straight_through_gradient_and_bad_shape():
    x = _heavy(rows=2, dtype=torch.float32).requires_grad_()
    g = torch.randn_like(x)
    (fake_quant(x) * g).sum().backward()
    torch.testing.assert_close(x.grad, g)
    with pytest.raises(ValueError, match="multiple of 32"):
        decompose_mxfp4(torch.ones(3, 40))


def test_adaptive_noise_tracks_the_entropy_target():
    aqn = AdaptiveQuantNoise(target_entropy=1.0, sigma=0.1, rate=0.5)
    assert aqn.update(0.5) > 0.1  # entropy too low: more noise
    high = aqn.sigma
    assert aqn.update(2.0) < high  # too high: less
    q = decompose_mxfp4(_heavy(rows=4, dtype=torch.float32)).q
    g = torch.Generator().manual_seed(0)
    noisy = aqn(q, generator=g)
    rel = (noisy - q).reshape(4, -1, 32).std(-1) / q.reshape(4, -1, 32).abs().amax(-1)
    assert 0 < float(rel.mean()) < aqn.sigma  # noise scales with the block scale (s < amax)


def test_triton_kernel_matches_the_reference_under_the_interpreter(interpreted):
    for case, errs in interpreted("_mxfp4_triton_check.py").items():
        assert max(errs.values()) < 1e-5, (case, errs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_on_cuda():
    x = _heavy(rows=64, dtype=torch.float32).cuda()
    tri = decompose_mxfp4(x, macro=8, outliers=1, backend="triton")
    ref = decompose_mxfp4(x, macro=8, outliers=1, backend="reference")
    torch.testing.assert_close(tri.q, ref.q)
