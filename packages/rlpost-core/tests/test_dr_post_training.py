"""Dr. Post-Training (001-12): projecting the target gradient onto a feasible set built
from general-data gradients; the special cases reproduce plain training."""

import itertools

import pytest
import torch

from rlpost.core.regularizers import apply_dr_projection_, dr_project, flat_grad, set_flat_grad_

f64 = torch.float64


def test_no_constraint_empty_set_or_zero_strength_is_plain_training():
    g = torch.tensor([0.3, -1.2, 2.0])
    H = torch.tensor([[1.0, 1.0, -1.0]])  # conflicts: <g, h> = -2.9
    assert torch.equal(dr_project(g, H, "none"), g)
    assert torch.equal(dr_project(g, torch.zeros(0, 3), "agree"), g)
    assert torch.equal(dr_project(g, H, "agree", strength=0.0), g)
    assert torch.equal(dr_project(g, H, "cone", strength=0.0), g)


def test_all_agreeing_general_set_gives_the_target_gradient_exactly():
    g = torch.randn(50, generator=torch.Generator().manual_seed(0))
    H = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    H = H * torch.sign(H @ g)[:, None]  # every general batch agrees with the target
    assert (H @ g > 0).all()
    assert torch.equal(dr_project(g, H, "agree"), g)


def test_a_conflicting_component_is_removed():
    # g = (1, 1), h = (0, -1): <g, h> = -1, so d = g - (-1 / 1) h = (1, 0)
    g, h = torch.tensor([1.0, 1.0], dtype=f64), torch.tensor([[0.0, -1.0]], dtype=f64)
    torch.testing.assert_close(dr_project(g, h, "agree"), torch.tensor([1.0, 0.0], dtype=f64))
    # generic D: the result is g minus its component along h, and orthogonal to h
    gen = torch.Generator().manual_seed(2)
    g, h = torch.randn(40, generator=gen, dtype=f64), torch.randn(1, 40, generator=gen, dtype=f64)
    h = -h * torch.sign(h @ g)  # make it conflict
    d = dr_project(g, h, "agree")
    torch.testing.assert_close(d, g - (h[0] @ g) / (h[0] @ h[0]) * h[0])
    assert abs((h[0] @ d).item()) < 1e-10
    # half strength: halfway between plain training and the projection
    torch.testing.assert_close(dr_project(g, h, "agree", 0.5), 0.5 * (g + d))


def _brute_force_agree(g, H):
    """Projection onto {d : H d >= 0} by enumerating active sets (independent form)."""
    best, best_dist = None, float("inf")
    M = H.shape[0]
    for k in range(M + 1):
        for S in itertools.combinations(range(M), k):
            if S:
                A = H[list(S)]
                d = g - A.T @ torch.linalg.solve(A @ A.T, A @ g)
            else:
                d = g
            if (H @ d >= -1e-9).all() and (g - d).norm() < best_dist:
                best, best_dist = d, (g - d).norm().item()
    return best


@pytest.mark.parametrize("seed", range(5))
def test_agree_projection_matches_active_set_enumeration(seed):
    gen = torch.Generator().manual_seed(10 + seed)
    g = torch.randn(6, generator=gen, dtype=f64)
    H = torch.randn(3, 6, generator=gen, dtype=f64)
    H[0] = -H[0] * torch.sign(H[0] @ g)  # at least one conflict
    torch.testing.assert_close(dr_project(g, H, "agree"), _brute_force_agree(g, H))


@pytest.mark.parametrize("seed", range(3))
def test_cone_projection_satisfies_kkt_and_selects_data(seed):
    gen = torch.Generator().manual_seed(20 + seed)
    g = torch.randn(8, generator=gen, dtype=f64)
    H = torch.randn(4, 8, generator=gen, dtype=f64)
    d = dr_project(g, H, "cone")
    w = torch.linalg.lstsq(H.T, d.unsqueeze(1)).solution.squeeze(1)  # d = H^T w
    torch.testing.assert_close(H.T @ w, d)
    assert (w >= -1e-9).all()  # a non-negative reweighting of general data
    r = H @ (g - d)  # KKT: no general direction improves the fit, active ones are tight
    assert (r <= 1e-9).all() and (w * r).abs().max() < 1e-9
    # brute force over supports of w
    best = min(
        (
            H[list(S)].T @ torch.linalg.lstsq(H[list(S)].T, g.unsqueeze(1)).solution.squeeze(1)
            for k in range(1, 5)
            for S in itertools.combinations(range(4), k)
            if (torch.linalg.lstsq(H[list(S)].T, g.unsqueeze(1)).solution >= -1e-12).all()
        ),
        key=lambda v: (g - v).norm().item(),
    )
    torch.testing.assert_close(d, best)


def test_cone_special_cases():
    g = torch.tensor([1.0, 2.0, 0.0], dtype=f64)
    # g is 1 * h1 + 2 * h2: inside the cone, untouched; a general set holding g itself too
    H = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=f64)
    torch.testing.assert_close(dr_project(g, H, "cone"), g)
    torch.testing.assert_close(dr_project(g, g[None], "cone"), g)
    # nothing to select: no update
    assert torch.equal(
        dr_project(g, torch.zeros(0, 3, dtype=f64), "cone"), torch.zeros(3, dtype=f64)
    )
    # a cone pointing away from g: the projection is 0
    torch.testing.assert_close(dr_project(g, -H[:2], "cone"), torch.zeros(3, dtype=f64))


def test_in_place_projection_on_a_model_protects_the_general_loss():
    gen = torch.Generator().manual_seed(3)
    model = torch.nn.Linear(4, 1).double()
    torch.nn.init.zeros_(model.weight), torch.nn.init.zeros_(model.bias)
    params = list(model.parameters())
    xg, yg = (
        torch.randn(16, 4, generator=gen, dtype=f64),
        torch.randn(16, 1, generator=gen, dtype=f64) - 3,  # pulls the bias down
    )
    xt, yt = (
        torch.randn(4, 4, generator=gen, dtype=f64),
        torch.randn(4, 1, generator=gen, dtype=f64) + 3,  # pulls it up: a conflict
    )

    def grad_of(x, y):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        return flat_grad(params).clone()

    hg = grad_of(xg, yg)
    gt = grad_of(xt, yt)  # p.grad now holds the target gradient
    assert hg @ gt < 0
    d = apply_dr_projection_(params, hg[None], "agree")
    torch.testing.assert_close(flat_grad(params), d)
    assert abs((hg @ d).item()) < 1e-12  # first-order change of the general loss: 0
    assert d @ gt > 0  # still a descent direction of the target loss
    state = [p.detach().clone() for p in params]

    def general_rise(direction):
        with torch.no_grad():
            for p, s in zip(params, state, strict=True):
                p.copy_(s)
            set_flat_grad_(params, direction)
            before = torch.nn.functional.mse_loss(model(xg), yg).item()
            torch.optim.SGD(params, lr=1e-4).step()
            return torch.nn.functional.mse_loss(model(xg), yg).item() - before

    plain, projected = general_rise(gt), general_rise(d)
    print(f"general-loss rise: plain {plain:.3e}, projected {projected:.3e}")
    assert plain > 0 and abs(projected) < 0.01 * plain  # second order only


@pytest.mark.parametrize("feasible", ["agree", "cone"])
def test_chunked_gram_and_assembly_match_one_chunk(feasible, monkeypatch):
    # the Gram matrix, H g and the result are built over column chunks (float64 per chunk,
    # never a float64 copy of [M, D]); 3-column chunks, the last one partial, must give the
    # single-chunk result, also for float32 gradients (returned in float32)
    import rlpost.core.regularizers.dr as reg

    gen = torch.Generator().manual_seed(3)
    g = torch.randn(11, generator=gen)
    H = torch.randn(4, 11, generator=gen)
    H[0] = -H[0] * torch.sign(H[0] @ g)  # a conflict, so "agree" projects
    whole = dr_project(g, H, feasible, strength=0.7)
    monkeypatch.setattr(reg, "CHUNK", 3)
    chunked = dr_project(g, H, feasible, strength=0.7)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, whole)
    assert not torch.equal(whole, g)  # the projection did something
    # and both equal the plain float64 formula on the full matrices
    Q, Hg = reg._gram(H, g, 3)
    torch.testing.assert_close(Q, H.double() @ H.double().T)
    torch.testing.assert_close(Hg, H.double() @ g.double())
