"""LPO (catalog 001-17): explicit listwise target on the response simplex + exact projection."""

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import OBJECTIVES, ObjectiveInput, PolicyBatch, get_preset
from rlpost.core.objectives.group import lpo_projection_grad

torch.set_num_threads(1)
LPO_ID = "001-17"
DIVS = ("forward_kl", "reverse_kl", "hellinger")


def reference_divergence(p, q, div):
    """The plain divergence between two probability vectors (autograd flows through q)."""
    if div == "forward_kl":
        return (p * (p.log() - q.log())).sum()
    if div == "reverse_kl":
        return (q * (q.log() - p.log())).sum()
    return 1 - (p * q).sqrt().sum()


def batch(seed=0, spread=0.3):
    B, T = 7, 5
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 4, 1, 5, 2, 4])
    mask = (torch.arange(T) < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 2
    logp = (old + spread * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    groups = torch.tensor([3, 3, 3, 3, 8, 8, 5])  # sizes 4, 2 and a singleton
    return mask, old, logp, adv, groups, lengths


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("length_norm", [True, False])
def test_gradient_equals_autograd_of_the_plain_divergence(div, length_norm):
    mask, old, logp, adv, groups, lengths = batch()
    beta = 0.7
    out = OBJECTIVES.build("lpo", beta=beta, divergence=div, length_norm=length_norm)(
        ObjectiveInput(logp, old, adv, mask, group_ids=groups)
    )
    total = (out.loss.sum(1) / lengths).sum()  # seq_mean_token_mean numerator
    (g,) = torch.autograd.grad(total, logp)
    # reference: sum_g n_g beta D(softmax(A_g / beta), softmax(l_g)), one group at a time
    x = logp.detach().clone().requires_grad_(True)
    ell = ((x - old) * mask).sum(1) / (lengths if length_norm else 1)
    ref = 0.0
    for gid in groups.unique():
        sel = groups == gid
        p = torch.softmax(adv[sel] / beta, 0)
        q = torch.softmax(ell[sel], 0)
        ref = ref + sel.sum() * beta * reference_divergence(p, q, div)
    (g_ref,) = torch.autograd.grad(ref, x)
    assert_close(g, g_ref)
    assert total.item() == pytest.approx(ref.item(), rel=1e-5)


@pytest.mark.parametrize("div", DIVS)
def test_projection_gradient_is_zero_sum_and_bounded(div, record_result):
    # extreme inputs: sequence log-ratios up to +-40, advantages up to +-5, beta 0.1
    g = torch.Generator().manual_seed(3)
    B, n = 64, 8
    idx = torch.arange(B) // n
    ell = torch.randn(B, generator=g, dtype=torch.float64) * 20
    adv = torch.randn(B, generator=g, dtype=torch.float64) * 2.5
    beta = 0.1
    logq = ell - torch.logsumexp(ell.view(-1, n), 1).repeat_interleave(n)
    logp = adv / beta - torch.logsumexp((adv / beta).view(-1, n), 1).repeat_interleave(n)
    D, c = lpo_projection_grad(logq, logp, idx, B // n, div)
    sums = torch.zeros(B // n, dtype=c.dtype).index_add(0, idx, c)
    assert sums.abs().max().item() < 1e-12  # zero-sum over every group
    bound = {
        "forward_kl": 1.0,
        "hellinger": 0.5,
        "reverse_kl": 1 / math.e + (-logp).max().item(),  # 1/e + log(1 / min p*)
    }[div]
    assert c.abs().max().item() <= bound
    if div == "forward_kl":
        assert torch.zeros(B // n, dtype=c.dtype).index_add(0, idx, c.abs()).max() <= 2.0
    assert (D >= -1e-12).all()
    row = {"divergence": div, "max_group_sum": sums.abs().max().item()}
    row |= {"max_abs_grad": c.abs().max().item(), "bound": bound}
    record_result("lpo_properties", [row], catalog_ids=[LPO_ID], seeds=[3])


def test_zero_sum_through_the_objective_and_first_order_grpo(record_result):
    mask, old, logp, adv, groups, lengths = batch(spread=1.0)
    out = OBJECTIVES.build("lpo", divergence="reverse_kl")(
        ObjectiveInput(logp, old, adv, mask, group_ids=groups)
    )
    (g,) = torch.autograd.grad((out.loss.sum(1) / lengths).sum(), logp)
    per_response = g.sum(1)  # = n_g beta dD/dl_i with length_norm
    for gid in groups.unique():
        assert abs(per_response[groups == gid].sum().item()) < 1e-5
    # on-policy, beta >> |A|: the projection gradient is GRPO's, -(A_i - mean_g A)/|y_i|
    at_old = old.clone().requires_grad_(True)
    out = OBJECTIVES.build("lpo", beta=1000.0)(
        ObjectiveInput(at_old, old, adv, mask, group_ids=groups)
    )
    (g,) = torch.autograd.grad((out.loss.sum(1) / lengths).sum(), at_old)
    centred = torch.zeros(9).index_add(0, groups, adv) / torch.zeros(9).index_add(
        0, groups, torch.ones(7)
    )
    grpo = -(adv - centred[groups])[:, None] * mask / lengths[:, None]
    assert_close(g, grpo, atol=2e-3, rtol=2e-3)
    row = {"first_order_max_abs_diff": (g - grpo).abs().max().item()}
    row |= {"grpo_max_abs_entry": grpo.abs().max().item()}
    record_result("lpo_properties", [row], catalog_ids=[LPO_ID])


def test_self_correcting_descent_reaches_the_target(record_result):
    # one-token responses: l_i = log pi(y_i) - log pi_old(y_i), free parameters (float64)
    old = torch.zeros(4, 1, dtype=torch.float64)
    x = torch.zeros(4, 1, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    target = torch.softmax(adv, 0)
    obj = OBJECTIVES.build("lpo")
    ds = []
    for _ in range(200):
        out = obj(ObjectiveInput(x, old, adv, torch.ones_like(x), group_ids=torch.zeros(4).long()))
        (g,) = torch.autograd.grad(out.loss.sum(), x)
        ds.append(out.loss[0, 0].item())
        with torch.no_grad():
            x -= 0.2 * g
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(ds))  # monotone in the divergence
    assert ds[0] == pytest.approx(0.24840, abs=1e-5) and ds[-1] < 1e-12
    assert_close(torch.softmax(x.detach().flatten(), 0), target, atol=1e-6, rtol=0)
    assert g.abs().max() < 1e-6  # the gradient vanishes at the target
    row = {"descent_first_divergence": ds[0], "descent_last_divergence": ds[-1]}
    record_result("lpo_properties", [row], catalog_ids=[LPO_ID])


def test_group_ids_required_and_split_groups_raise():
    mask, old, logp, adv, groups, _ = batch()
    with pytest.raises(ValueError, match=r"'lpo' needs group_ids \(ObjectiveInput\.group_ids\)"):
        OBJECTIVES.build("lpo")(ObjectiveInput(logp, old, adv, mask))
    with pytest.raises(ValueError, match="group_ids must be \\[B\\]"):
        ObjectiveInput(logp, old, adv, mask, group_ids=groups[:3])
    recipe = get_preset("lpo").replace(group_size=4).build()
    with pytest.raises(ValueError, match="whole groups"):
        recipe.policy_loss(PolicyBatch(logp, old, adv, mask, group_ids=groups))


@pytest.mark.parametrize("div", DIVS)
def test_fully_masked_row_does_not_enter_its_group(div):
    # a response with no valid token (e.g. rejected by a correction) and advantage 5 must
    # not reshape the target of its group: the gradient of the other rows equals that of
    # the same batch without the row (before the fix it flipped the others' gradients)
    mask, old, logp, adv, groups, _ = batch()
    f = OBJECTIVES.build("lpo", divergence=div)
    mask2, adv2 = mask.clone(), adv.clone()
    mask2[0] = 0.0
    adv2[0] = 5.0
    out = f(ObjectiveInput(logp, old, adv2, mask2, group_ids=groups))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    keep = torch.arange(7) != 0
    x = logp.detach()[keep].clone().requires_grad_(True)
    ref = f(ObjectiveInput(x, old[keep], adv[keep], mask[keep], group_ids=groups[keep]))
    (g_ref,) = torch.autograd.grad(ref.loss.sum(), x)
    assert_close(g[keep], g_ref)
    assert (g[0] == 0).all() and (out.loss[0] == 0).all()
    assert out.metrics["lpo_divergence"] == pytest.approx(ref.metrics["lpo_divergence"])
