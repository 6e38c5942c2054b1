"""CPO (004-18): Fisher surrogate from prior-task parameter movement and its penalty."""

import math

import pytest
import torch

from rlpost.core.regularizers import CPORegularizer, movement_fisher

CPO_ID = "004-18"


def test_surrogate_matches_its_definition():
    # delta^2 = [1, 4, 0 | 9, 0.25]: mean 14.25 / 5 = 2.85; density 0.4 keeps the top
    # ceil(0.4 * 5) = 2 entries (9 and 4), the rest are 0
    start = [torch.zeros(3), torch.ones(2)]
    end = [torch.tensor([1.0, -2.0, 0.0]), torch.tensor([4.0, 1.5])]
    F = movement_fisher(start, end, density=0.4)
    torch.testing.assert_close(F[0], torch.tensor([0.0, 4 / 2.85, 0.0]))
    torch.testing.assert_close(F[1], torch.tensor([9 / 2.85, 0.0]))
    dense = movement_fisher(start, end, density=1.0)
    torch.testing.assert_close(torch.cat(dense), torch.tensor([1, 4, 0, 9, 0.25]) / 2.85)
    assert torch.cat(dense).mean().item() == pytest.approx(1.0)  # unit-free
    assert all((f == 0).all() for f in movement_fisher(start, start))  # no movement
    with pytest.raises(ValueError, match="density"):
        movement_fisher(start, end, density=0.0)


def test_penalty_gradient_is_zero_at_the_anchor_and_matches_coef_F_delta():
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.zeros(6))
    reg = CPORegularizer([w], coef=2.0, density=0.5)
    assert reg.penalty().item() == 0.0  # nothing consolidated yet
    reg.begin_task()
    with torch.no_grad():
        w.add_(torch.tensor([3.0, -2.0, 1.0, 0.1, 0.0, -0.2]))
    reg.end_task()
    F, anchor = reg.fisher[0], reg.anchor[0]
    (g,) = torch.autograd.grad(reg.penalty(), w)
    assert (g == 0).all() and reg.penalty().item() == 0.0
    with torch.no_grad():
        w.add_(torch.randn(6, generator=gen))
    (g,) = torch.autograd.grad(reg.penalty(), w)
    torch.testing.assert_close(g, 2.0 * F * (w.detach() - anchor))  # coef F (theta - theta*)
    assert (g[F == 0] == 0).all() and (F > 0).sum() == 3  # sparse: top half only


def test_important_parameters_are_pulled_back_more():
    w = torch.nn.Parameter(torch.zeros(3))
    reg = CPORegularizer([w], coef=1.0, density=1.0)
    reg.begin_task()
    with torch.no_grad():
        w.copy_(torch.tensor([2.0, 1.0, 0.5]))  # F proportional to 4 : 1 : 0.25
    reg.end_task()
    with torch.no_grad():
        w.add_(1.0)  # displace every parameter equally
    opt = torch.optim.SGD([w], lr=0.1)
    opt.zero_grad()
    reg.penalty().backward()
    opt.step()
    back = 1.0 - (w.detach() - reg.anchor[0])  # how far each one came back
    assert back[0] > back[1] > back[2] > 0, back
    torch.testing.assert_close(back, 0.1 * reg.fisher[0])


def test_tasks_accumulate_and_reduce_forgetting(record_result):
    """Two linear-regression tasks: A reads inputs 0-3, B (2 samples) reads inputs 2-7, so
    B can be fitted without moving what A needs, but plain training moves it anyway."""
    gen = torch.Generator().manual_seed(1)
    D = 8
    xa = torch.zeros(8, D)
    xa[:, :4] = torch.randn(8, 4, generator=gen)
    ya = xa @ torch.randn(D, generator=gen)
    xb = torch.zeros(2, D)
    xb[:, 2:] = torch.randn(2, 6, generator=gen)
    yb = torch.randn(2, generator=gen) * 3

    def mse(w, x, y):
        return ((x @ w - y) ** 2).mean()

    def run(coef):
        w = torch.nn.Parameter(torch.zeros(D))
        reg = CPORegularizer([w], coef=coef, density=0.5)
        opt = torch.optim.SGD([w], lr=0.1)
        for x, y in ((xa, ya), (xb, yb)):
            reg.begin_task()
            for _ in range(1000):
                opt.zero_grad()
                (mse(w, x, y) + reg.penalty()).backward()
                opt.step()
            reg.end_task()
        return mse(w, xa, ya).item(), mse(w, xb, yb).item(), reg

    forget_plain, fit_plain, _ = run(0.0)
    forget_cpo, fit_cpo, reg = run(1.0)
    rows = [
        {"method": "plain", "task_a_loss_after_b": forget_plain, "task_b_loss": fit_plain},
        {"method": "cpo", "task_a_loss_after_b": forget_cpo, "task_b_loss": fit_cpo},
    ]
    record_result("cpo_forgetting", rows, catalog_ids=[CPO_ID], config={"coef": 1.0})
    assert (reg.fisher[0] > 0).sum() >= 3  # two tasks' surrogates summed
    assert forget_cpo < 0.2 * forget_plain
    assert fit_cpo < 1e-3 and fit_plain < 1e-3


def test_resume_mid_task_can_end_the_task():
    # state saved between begin_task() and end_task() must carry the task's start, or the
    # resumed run cannot end the task (and the movement would be measured from nowhere)
    w = torch.nn.Parameter(torch.zeros(4))
    reg = CPORegularizer([w], density=0.5)
    reg.begin_task()
    with torch.no_grad():
        w += torch.tensor([1.0, -2.0, 0.1, 0.0])
    state = reg.state_dict()
    w2 = torch.nn.Parameter(w.detach().clone())
    resumed = CPORegularizer([w2], density=0.5)
    resumed.load_state_dict(state)
    resumed.end_task()
    reg.end_task()
    torch.testing.assert_close(resumed.fisher[0], reg.fisher[0])
    # delta^2 = [1, 4, 0.01, 0], mean 1.2525; the top 2 kept
    torch.testing.assert_close(resumed.fisher[0], torch.tensor([1.0, 4.0, 0.0, 0.0]) / 1.2525)
    # a state saved before the start was recorded still loads (no task in progress)
    old = CPORegularizer([w2])
    old.load_state_dict({"fisher": None, "anchor": None})
    with pytest.raises(RuntimeError, match="without begin_task"):
        old.end_task()


def test_movement_fisher_cut_is_exact_without_concatenation():
    # the k-th largest value is found by bisection on float32 bit patterns: it must equal
    # a topk over the concatenation, ties at the cut all kept
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(7, 5, generator=g), torch.randn(13, generator=g)]
    end = [s + torch.randn(s.shape, generator=g) for s in start]
    end[1][:4] = start[1][:4] + 0.5  # ties
    sq = torch.cat([((b - a) ** 2).reshape(-1) for a, b in zip(start, end, strict=True)])
    for density in (0.01, 0.1, 0.37, 1.0):
        F = movement_fisher(start, end, density)
        k = max(1, math.ceil(density * sq.numel()))
        cut = sq.topk(k).values[-1]
        want = torch.where(sq >= cut, sq / sq.mean(), torch.zeros_like(sq))
        torch.testing.assert_close(torch.cat([f.reshape(-1) for f in F]), want)
    assert all(x is not y for x, y in zip(movement_fisher(start, end), start, strict=True))
