"""Attention-entropy token weights (catalog 001-08): entropy from attention maps, anchor /
explorer subsets, the random-subset estimator and the dynamic soft reweighting."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import (
    OBJECTIVES,
    ObjectiveInput,
    PolicyBatch,
    anchor_explorer_masks,
    attention_entropy,
    dynamic_entropy_weights,
    get_preset,
    random_token_subset,
)

AE_ID = "001-08"


def test_entropy_of_uniform_one_hot_and_empty_rows():
    att = torch.zeros(1, 2, 3, 4)  # (B, H, T, S)
    att[0, :, 0, :3] = 1 / 3  # uniform over the 3 valid keys (key 3 masked) -> log 3
    att[0, :, 1, 2] = 1.0  # one-hot -> 0
    # row 2 all zero (a fully masked query) -> 0, not NaN
    ent = attention_entropy(att)
    assert_close(ent, torch.tensor([[math.log(3), 0.0, 0.0]]))
    # heads and layers are averaged: head 1 one-hot in row 0 -> (log 3 + 0) / 2
    att2 = att.clone()
    att2[0, 1, 0] = torch.tensor([1.0, 0, 0, 0])
    assert_close(attention_entropy(att2)[0, 0], torch.tensor(math.log(3) / 2))
    assert_close(attention_entropy((att, att2))[0, 0], torch.tensor(0.75 * math.log(3)))
    # unnormalised (bf16-rounded) rows are renormalised; NaN rows count as empty
    att3 = att.clone().to(torch.bfloat16) * 1.01
    att3[0, :, 2] = float("nan")
    assert_close(attention_entropy(att3), ent, rtol=0, atol=2e-3)
    masked = attention_entropy(att, query_mask=torch.tensor([[0.0, 1.0, 1.0]]))
    assert masked[0, 0] == 0
    with pytest.raises(ValueError, match="every layer must be"):
        attention_entropy((att, att[:, :, :2]))


def test_entropy_in_head_chunks_matches_the_plain_formula_and_leaves_input_alone():
    g = torch.Generator().manual_seed(0)
    layers = [torch.rand(2, 5, 4, 6, generator=g).softmax(-1) for _ in range(3)]
    layers[1][0, 2, 1] = float("nan")  # a NaN row counts as empty (entropy 0 for that head)
    layers[2][1, :, 3] = 0.0
    before = [x.clone() for x in layers]
    # reference: per head, per layer, -sum p log p of the renormalised cleaned rows
    ref = []
    for a in layers:
        q = torch.nan_to_num(a, nan=0.0)
        q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
        ref.append(-(q * torch.where(q > 0, q.log(), 0.0)).sum(-1).mean(1))
    ref = torch.stack(ref).mean(0)
    whole = attention_entropy(layers)
    for chunk in (1, 2 * 4 * 6 * 2, 10**9):  # one head, two heads, a whole layer per chunk
        assert_close(attention_entropy(layers, chunk_elements=chunk), ref)
    assert_close(whole, ref)
    for x, y in zip(layers, before, strict=True):  # the in-place work is on a copy
        assert torch.equal(x.nan_to_num(-1.0), y.nan_to_num(-1.0))
    with pytest.raises(ValueError, match="chunk_elements"):
        attention_entropy(layers, chunk_elements=0)


def test_entropy_from_a_tiny_hugging_face_model(record_result):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.5,  # large weights: peaked, varied attention rows
    )
    cfg._attn_implementation = "eager"  # SDPA does not return attention maps
    torch.manual_seed(0)
    model = transformers.Qwen2Model(cfg).eval()
    B, T = 3, 12
    ids = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(0))
    am = (torch.arange(T) < torch.tensor([12, 9, 5])[:, None]).long()  # right padding
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=am, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (B, 4, T, T)
    ent = attention_entropy(out.attentions, query_mask=am)
    assert ent.shape == (B, T) and torch.isfinite(ent).all()
    assert (ent[am == 0] == 0).all()
    # a causal query at position t sees t + 1 keys: 0 <= H <= log(t + 1), H = 0 at t = 0
    bound = torch.log(torch.arange(T) + 1.0).expand(B, T)
    valid = am.bool()
    assert (ent[valid] >= 0).all() and (ent[valid] <= bound[valid] + 1e-5).all()
    assert_close(ent[:, 0], torch.zeros(B), atol=1e-6, rtol=0)
    assert (ent[valid] < bound[valid] - 0.05).sum() > valid.sum() // 2  # not all uniform
    sub = anchor_explorer_masks(ent, am, quantile=0.2)
    assert ent[sub.anchors].max() <= ent[sub.explorers].min()
    row = {"valid_tokens": int(valid.sum()), "anchors": int(sub.anchors.sum())}
    row |= {"explorers": int(sub.explorers.sum()), "anchor_max_H": ent[sub.anchors].max().item()}
    row |= {"explorer_min_H": ent[sub.explorers].min().item(), "row0_H": ent[0].tolist()}
    row |= {"below_bound_by_0.05": int((ent[valid] < bound[valid] - 0.05).sum())}
    record_result("attention_entropy_properties", [row], catalog_ids=[AE_ID])


def test_anchor_and_explorer_subsets():
    ent = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.7, 0.0], [5.0, 6.0, 7.0, 8.0, 9.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    # per sequence, n = 5 and 6, k = round(0.2 n) = 1: lowest / highest valid token per row;
    # row 0's padded 0.0 is never an anchor
    s = anchor_explorer_masks(ent, mask, 0.2, per_sequence=True)
    assert s.anchors.nonzero().tolist() == [[0, 1], [1, 5]]
    assert s.explorers.nonzero().tolist() == [[0, 2], [1, 4]]
    # per batch, n = 11, k = 2: both anchors in the low row, both explorers in the high one
    s = anchor_explorer_masks(ent, mask, 0.2)
    assert s.anchors.nonzero().tolist() == [[0, 1], [0, 3]]
    assert s.explorers.nonzero().tolist() == [[1, 3], [1, 4]]
    # exact sizes and disjointness even with ties and quantile 0.5 on an odd count
    tied = torch.zeros(1, 7)
    s = anchor_explorer_masks(tied, torch.ones(1, 7), 0.5)
    assert s.anchors.sum() == 4 and s.explorers.sum() == 3 and not (s.anchors & s.explorers).any()
    with pytest.raises(ValueError, match="quantile must be in"):
        anchor_explorer_masks(ent, mask, 0.6)


def _policy_grad(token_weights, x, targets, A, mask, W):
    """Gradient w.r.t. W of the sum-aggregated token loss of a tiny softmax policy."""
    logp = torch.log_softmax(x @ W, -1).gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
    out = OBJECTIVES.build("reinforce")(ObjectiveInput(logp, logp.detach(), A, mask, None,
                                                       token_weights))  # fmt: skip
    return torch.autograd.grad(out.loss.sum(), W)[0].flatten()


def test_random_20_percent_subset_estimator_is_unbiased(record_result):
    g = torch.Generator().manual_seed(0)
    B, T, D, V = 4, 10, 3, 5
    x, targets = torch.randn(B, T, D, generator=g), torch.randint(0, V, (B, T), generator=g)
    A = torch.randn(B, T, generator=g)
    mask = (torch.arange(T) < torch.tensor([10, 7, 4, 9])[:, None]).float()
    W = torch.randn(D, V, generator=g, requires_grad=True)
    full = _policy_grad(None, x, targets, A, mask, W)
    draws, kept = [], []
    for _ in range(3000):
        sub = random_token_subset(mask, 0.2, generator=g)
        draws.append(_policy_grad(sub.weights, x, targets, A, mask, W))
        kept.append(sub.mask.sum() / mask.sum())
        assert not (sub.mask & (mask == 0)).any()
    G = torch.stack(draws)  # (N, D * V)
    se = G.std(0) / math.sqrt(len(draws))
    z = (G.mean(0) - full) / se
    assert z.abs().max() < 4.5, z  # 15 components, each within a few standard errors
    assert abs(torch.stack(kept).mean().item() - 0.2) < 0.01
    # without the 1/frac weights the same draws estimate 0.2 x the full gradient: caught
    z_unweighted = (0.2 * G.mean(0) - full) / (0.2 * se)
    assert z_unweighted.abs().max() > 20
    cos = torch.nn.functional.cosine_similarity(G, full[None], dim=1)
    row = {"draws": len(draws), "max_abs_z": z.abs().max().item()}
    row |= {"kept_frac": torch.stack(kept).mean().item()}
    row |= {"mean_rel_error": ((G.mean(0) - full).norm() / full.norm()).item()}
    row |= {"single_draw_rel_error": ((G - full).norm(dim=1) / full.norm()).mean().item()}
    row |= {"single_draw_mean_cosine": cos.mean().item()}
    row |= {"unweighted_max_abs_z": z_unweighted.abs().max().item()}
    record_result("attention_entropy_properties", [row], catalog_ids=[AE_ID], seeds=[0])
    with pytest.raises(ValueError, match="frac must be in"):
        random_token_subset(mask, 0.0)


def test_dynamic_weights_mean_one_and_schedule(record_result):
    # entropies 0, 1, 2 (+ a masked token): z = -1, 0, 1; progress 0: lam = -1 -> w ∝ e, 1, 1/e
    ent = torch.tensor([[0.0, 1.0, 2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w0 = dynamic_entropy_weights(ent, mask, progress=0.0)
    e = math.e
    assert_close(w0, 3 * torch.tensor([[e, 1.0, 1 / e, 0.0]]) / (e + 1 + 1 / e))
    assert_close(dynamic_entropy_weights(ent, mask, progress=0.5), mask)  # lam = 0: uniform
    w1 = dynamic_entropy_weights(ent, mask, progress=1.0)
    assert_close(w1, w0.flip(1).roll(-1, 1))  # lam = +1 mirrors the weights onto explorers

    g = torch.Generator().manual_seed(5)
    ent = torch.rand(6, 20, generator=g) * 3
    mask = (torch.arange(20) < torch.randint(5, 21, (6, 1), generator=g)).float()
    sub = anchor_explorer_masks(ent, mask, 0.2)
    rows = []
    for progress in (0.0, 0.25, 0.5, 0.75, 1.0):
        w = dynamic_entropy_weights(ent, mask, progress)
        assert_close(w[mask > 0].mean(), torch.tensor(1.0))
        assert (w[mask == 0] == 0).all() and torch.isfinite(w).all()
        rows.append({"progress": progress, "anchors_mean": w[sub.anchors].mean().item()})
        rows[-1] |= {"explorers_mean": w[sub.explorers].mean().item(), "max": w.max().item()}
        rows[-1] |= {"min_valid": w[mask > 0].min().item()}
    record_result("attention_entropy_weights", rows, catalog_ids=[AE_ID], seeds=[5])
    w0, w1 = (dynamic_entropy_weights(ent, mask, p) for p in (0.0, 1.0))
    assert w0[sub.anchors].mean() > 1.5 > 0.6 > w0[sub.explorers].mean()
    assert w1[sub.explorers].mean() > 1.5 > 0.6 > w1[sub.anchors].mean()
    assert (dynamic_entropy_weights(ent, torch.zeros_like(mask), 0.0) == 0).all()  # no NaN
    with pytest.raises(ValueError, match="progress must be in"):
        dynamic_entropy_weights(ent, mask, 1.5)


def test_dynamic_weights_scale_each_tokens_gradient_in_a_recipe():
    g = torch.Generator().manual_seed(6)
    B, T = 4, 6
    mask = (torch.arange(T) < torch.tensor([6, 3, 5, 2])[:, None]).float()
    logp = (-torch.rand(B, T, generator=g)).requires_grad_(True)
    old, A = logp.detach() + 0.01, torch.randn(B, generator=g)
    w = dynamic_entropy_weights(torch.rand(B, T, generator=g), mask, progress=0.0)
    recipe = get_preset("dapo").build()
    (g0,) = torch.autograd.grad(recipe.policy_loss(PolicyBatch(logp, old, A, mask)).loss, logp)
    (gw,) = torch.autograd.grad(
        recipe.policy_loss(PolicyBatch(logp, old, A, mask, token_weights=w)).loss, logp
    )
    assert_close(gw, g0 * w)
