"""SD-Search's token-level Jensen-Shannon divergence (catalog 000-16)."""

import math

import torch

from rlpost.core.distill import DISTILL_ESTIMATORS, DistillInput, TeacherDistributions


def _inp(student, teacher, mask, full=True):
    d = TeacherDistributions(student, teacher, torch.zeros(mask.shape, dtype=torch.long))
    lp = student[..., 0]
    return DistillInput(
        lp, mask, teacher_logp=teacher[..., 0], **({"full": d} if full else {"topk": d})
    )


def _reference(p, q):
    """JSD = H(m) - (H(p) + H(q)) / 2, from probabilities."""

    def h(x):
        return -(x * torch.where(x > 0, x.log(), 0.0)).sum(-1)

    return h((p + q) / 2) - (h(p) + h(q)) / 2


def test_value_and_gradient_match_the_entropy_form():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 6, generator=g, requires_grad=True)
    teacher = torch.randn(3, 4, 6, generator=g).log_softmax(-1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.float)
    out = DISTILL_ESTIMATORS.build("jsd")(_inp(logits.log_softmax(-1), teacher, mask))
    ref = _reference(logits.softmax(-1), teacher.exp()) * mask
    torch.testing.assert_close(out.loss, ref)
    (g1,) = torch.autograd.grad(out.loss.sum(), logits)
    logits2 = logits.detach().clone().requires_grad_(True)
    (g2,) = torch.autograd.grad(
        (_reference(logits2.softmax(-1), teacher.exp()) * mask).sum(), logits2
    )
    torch.testing.assert_close(g1, g2)
    assert (g1[mask == 0] == 0).all()  # masked tokens: zero gradient


def test_symmetric_bounded_and_zero_iff_equal():
    a = torch.tensor([[[0.0, -50.0]]]).log_softmax(-1)  # (almost) all mass on id 0
    b = torch.tensor([[[-50.0, 0.0]]]).log_softmax(-1)  # on id 1
    m = torch.ones(1, 1)
    est = DISTILL_ESTIMATORS.build("jsd")
    ab, ba = est(_inp(a, b, m)).loss, est(_inp(b, a, m)).loss
    torch.testing.assert_close(ab, ba)
    assert abs(float(ab) - math.log(2)) < 1e-6  # disjoint supports: ln 2
    assert float(est(_inp(a, a, m)).loss) == 0.0
    # a teacher with probability-0 ids (top-K outside) gives no NaN
    t = torch.tensor([[[0.0, -torch.inf]]])
    assert torch.isfinite(est(_inp(a, t, m)).loss).all()


def test_topk_renormalises_over_the_ids():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 3, 5, generator=g).log_softmax(-1)[..., :3]  # a top-3 of 5 ids
    t = torch.randn(2, 3, 5, generator=g).log_softmax(-1)[..., :3]
    m = torch.ones(2, 3)
    out = DISTILL_ESTIMATORS.build("jsd_topk")(_inp(s, t, m, full=False)).loss
    ref = _reference(s.softmax(-1), t.softmax(-1))
    torch.testing.assert_close(out, ref)
