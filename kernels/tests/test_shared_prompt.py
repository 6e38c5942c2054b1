"""Shared-prompt attention (000-21, DualKV) and group packing equal the unpacked layout."""

import pytest
import torch
import torch.nn.functional as F

from rlpost.kernels.ops.shared_prompt import (
    pack_group,
    pack_groups,
    packing_ratio,
    shared_prompt_attention,
)


def test_shared_prompt_attention_equals_causal_attention_per_sequence():
    g = torch.Generator().manual_seed(0)
    N, H, P, R, d = 3, 2, 5, 4, 8

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    q_p, k_p, v_p = t(H, P, d), t(H, P, d), t(H, P, d)
    q_r, k_r, v_r = t(N, H, R, d), t(N, H, R, d), t(N, H, R, d)
    out_p, out_r = shared_prompt_attention(q_p, k_p, v_p, q_r, k_r, v_r)
    gp, gr = torch.randn_like(out_p), torch.randn_like(out_r)
    grads = torch.autograd.grad(
        (out_p * gp).sum() + (out_r * gr).sum(), (q_p, k_p, v_p, q_r, k_r, v_r)
    )

    # the obvious layout: N full sequences [prompt; response_i], standard causal attention
    def cat(a, b):
        return torch.cat([a.expand(N, H, P, d), b], dim=2)

    full = F.scaled_dot_product_attention(
        cat(q_p, q_r), cat(k_p, k_r), cat(v_p, v_r), is_causal=True
    )  # [N, H, P + R, d]
    for i in range(N):
        torch.testing.assert_close(full[i, :, :P], out_p)
    torch.testing.assert_close(full[:, :, P:], out_r)
    # the prompt's outputs are counted once in the shared layout: weight them once
    loss = (full[0, :, :P] * gp).sum() + (full[:, :, P:] * gr).sum()
    want = torch.autograd.grad(loss, (q_p, k_p, v_p, q_r, k_r, v_r))
    for got, w in zip(grads, want, strict=True):
        torch.testing.assert_close(got, w)


def test_pack_group_layout():
    ids, pos, allow = pack_group([7, 8, 9], torch.tensor([[1, 2], [3, 4]]))
    assert ids.tolist() == [7, 8, 9, 1, 2, 3, 4]
    assert pos.tolist() == [0, 1, 2, 3, 4, 3, 4]
    assert allow[4].tolist() == [True, True, True, True, True, False, False]  # r1 token 2
    assert allow[5].tolist() == [True, True, True, False, False, True, False]  # r2 token 1
    assert allow[1].tolist() == [True, True, False, False, False, False, False]


def test_pack_groups_gathers_the_predicting_positions():
    pk = pack_groups([[5, 6], [9], [5, 6]], torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), 0)
    assert pk.tokens == [2 + 2 * 3, 1 + 3] and pk.input_ids.shape == (2, 8)
    T = 8
    # row 0: first token predicted by the prompt's last position (1), then by its own
    assert pk.gather[0].tolist() == [1, 2, 3]
    assert pk.gather[2].tolist() == [1, 5, 6]  # second response of the same prompt
    assert pk.gather[1].tolist() == [T + 0, T + 1, T + 2]
    assert pk.input_ids[0].tolist() == [5, 6, 1, 2, 3, 7, 8, 9]


def test_ragged_pack_keeps_real_tokens_and_separates_groups():
    """Ragged layout: responses at their own lengths, two short groups in one row, no
    attention across groups or between responses, a group longer than a row split with its
    prompt repeated."""
    comp = torch.tensor([[1, 2, 3], [4, 0, 0], [7, 8, 0], [10, 11, 0]])
    lengths = torch.tensor([3, 1, 2, 2])
    pk = pack_groups([[5, 6], [5, 6], [9], [12]], comp, 0, lengths)
    assert pk.layout is None and pk.input_ids.shape == (2, 6)  # 2+3+1, then 1+2 and 1+2
    assert pk.input_ids.tolist() == [[5, 6, 1, 2, 3, 4], [9, 7, 8, 12, 10, 11]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 2], [0, 1, 2, 0, 1, 2]]
    assert pk.gather[0].tolist() == [1, 2, 3]
    assert pk.gather[1].tolist() == [1, 1, 1]  # past the length: its last predicting position
    assert pk.gather[2].tolist() == [6, 7, 7] and pk.gather[3].tolist() == [9, 10, 10]
    assert pk.allow[0, 5].tolist() == [True, True, False, False, False, True]
    assert pk.allow[1, 4].tolist() == [False, False, False, True, True, False]  # own group
    split = pack_groups([[5, 6]] * 3, torch.ones(3, 4, dtype=torch.long), 0,
                        torch.tensor([4, 4, 4]), row_tokens=10)  # fmt: skip
    assert split.input_ids.shape[1] == 10 and split.input_ids.shape[0] == 2
    assert sorted(split.tokens) == [6, 10]  # [p; r; r] and [p; r]


@pytest.mark.parametrize("ragged", [False, True])
def test_packing_without_the_last_tokens_gathers_the_same_predictions(ragged):
    """``last_token=False``: each response's last token leaves the packed input (one
    position less per response) and every completion token is still predicted from the
    position of the token before it, the prompt's last for token 0."""
    comp = torch.tensor([[1, 2, 3], [4, 0, 0], [7, 8, 0]])
    lengths = torch.tensor([3, 1, 2]) if ragged else None
    prompts = [[5, 6], [5, 6], [9]]
    full = pack_groups(prompts, comp, 0, lengths)
    lean = pack_groups(prompts, comp, 0, lengths, last_token=False)
    assert sum(lean.tokens) == sum(full.tokens) - 3
    flat_full, flat_lean = full.input_ids.reshape(-1), lean.input_ids.reshape(-1)
    pos_full, pos_lean = full.position_ids.reshape(-1), lean.position_ids.reshape(-1)
    n = lengths.tolist() if ragged else [3, 3, 3]
    for b in range(3):
        for t in range(n[b]):  # the same input token at the same position predicts token t
            i, j = int(full.gather[b, t]), int(lean.gather[b, t])
            assert flat_lean[j] == flat_full[i] and pos_lean[j] == pos_full[i]
            assert (prompts[b] + comp[b].tolist())[len(prompts[b]) + t - 1] == flat_lean[j]
    if ragged:
        assert lean.input_ids.tolist() == [[5, 6, 1, 2], [9, 7, 0, 0]]  # r_2 (length 1): none
    else:
        assert lean.layout == [(2, 2, 2), (1, 1, 2)]
        one = pack_groups(prompts, comp[:, :1], 0, last_token=False)
        assert one.layout == [(2, 2, 1), (1, 1, 1)]  # L = 1 keeps its token


def test_packing_ratio():
    assert packing_ratio(1, 256, 64) == 1.0
    assert abs(packing_ratio(8, 256, 64) - 8 * 320 / (256 + 512)) < 1e-12


def test_triton_kernels_match_the_reference_under_the_interpreter(interpreted):
    for case, errs in interpreted("_shared_prompt_triton_check.py").items():
        assert max(errs) < 1e-5, (case, errs)  # both outputs and all six gradients


def _outputs_and_grads(ins, backend):
    outs = shared_prompt_attention(*ins, backend=backend)
    g = torch.Generator(device=ins[0].device).manual_seed(1)
    loss = sum(
        (torch.randn(o.shape, generator=g, device=o.device) * o.double()).sum() for o in outs
    )
    return [*outs, *torch.autograd.grad(loss, ins)]


@pytest.mark.parametrize(
    "N,H,P,R,d", [(3, 2, 5, 4, 8), (1, 1, 1, 1, 4), (6, 4, 40, 17, 16), (2, 2, 3, 9, 8)]
)
def test_the_cpu_backends_equal_the_reference(N, H, P, R, d):
    """The CPU backends (``auto`` off CUDA: ``split`` where the prompt is long, else
    ``sdpa``): outputs and all six gradients equal the explicit
    softmax's, in float64 to 1e-10 and in float32 to 1e-5, for inputs laid out as the
    packed forward hands them over (views of one ``[H, P + N R, d]`` sequence); a wrong
    mask offset (a response seeing its own future, or not the whole prompt), or a split
    whose backward took each part's own log-sum-exp instead of the merged one, fails."""
    g = torch.Generator().manual_seed(P + R)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        seqs = [torch.randn(H, P + N * R, d, generator=g, dtype=dtype) for _ in range(3)]
        leaves = [x.requires_grad_() for x in seqs]
        prompt = [x[:, :P] for x in leaves]
        responses = [x[:, P:].unflatten(1, (N, R)).transpose(0, 1) for x in leaves]
        ins = (*prompt, *responses)
        ref = _outputs_and_grads(ins, "reference")
        for backend in ("sdpa", "split", "auto"):
            got = _outputs_and_grads(ins, backend)
            for a, b in zip(got, ref, strict=True):
                torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["split", "sdpa", "reference", "auto"])
def test_grouped_keys_and_values_equal_their_repeated_heads(backend):
    """Keys and values with fewer heads than the queries (grouped-query attention, as a
    Qwen2 layer hands them over): outputs and the gradients of the grouped keys and values
    equal the call on heads repeated per query head, whose key / value gradients sum over
    each group; the split reads them grouped, the other backends repeat them."""
    N, H, h, P, R, d = 3, 4, 2, 140, 9, 8  # (P long enough that auto takes the split)
    g = torch.Generator().manual_seed(3)
    q = [torch.randn(H, P, d, generator=g, dtype=torch.float64),
         torch.randn(N, H, R, d, generator=g, dtype=torch.float64)]  # fmt: skip
    kv = [torch.randn(h, P, d, generator=g, dtype=torch.float64) for _ in range(2)]
    kv += [torch.randn(N, h, R, d, generator=g, dtype=torch.float64) for _ in range(2)]
    grouped = [x.clone().requires_grad_() for x in (q[0], *kv[:2], q[1], *kv[2:])]
    got = _outputs_and_grads(tuple(grouped), backend)
    rep = [x.clone().requires_grad_() for x in grouped]
    expanded = [
        rep[0], *(x.repeat_interleave(2, 0) for x in rep[1:3]),
        rep[3], *(x.repeat_interleave(2, 1) for x in rep[4:]),
    ]  # fmt: skip
    outs = shared_prompt_attention(*expanded, backend="reference")
    g1 = torch.Generator().manual_seed(1)
    loss = sum((torch.randn(o.shape, generator=g1) * o.double()).sum() for o in outs)
    want = [*outs, *torch.autograd.grad(loss, rep)]
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_the_split_keeps_bfloat16_and_its_accuracy():
    """In bfloat16 the split returns bfloat16 (its log-sum-exps are float32) and is as
    close to the float64 reference as the SDPA backend, outputs and gradients."""
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(2, 40, 16, generator=g) for _ in range(3)]
    ins += [torch.randn(3, 2, 17, 16, generator=g) for _ in range(3)]
    ref = _outputs_and_grads(tuple(x.double().requires_grad_() for x in ins), "reference")
    errs = {}
    for backend in ("split", "sdpa"):
        got = _outputs_and_grads(tuple(x.bfloat16().requires_grad_() for x in ins), backend)
        assert {x.dtype for x in got} == {torch.bfloat16}
        errs[backend] = max(_rel_err(x.detach(), r.detach()) for x, r in zip(got, ref, strict=True))
    assert errs["split"] <= 2 * errs["sdpa"] and errs["split"] < 0.02, errs


def test_the_split_keeps_no_per_response_copy_of_the_prompt_for_the_backward():
    """What the backward keeps: SDPA's call holds ``[N, H, P + R, d]`` keys and values (the
    prompt's copied per response); the split keeps the prompt's once, ``N - 1`` copies of
    ``2 H P d`` floats fewer."""
    N, H, P, R, d = 6, 2, 48, 8, 16
    ins = [torch.randn(H, P, d).requires_grad_() for _ in range(3)]
    ins += [torch.randn(N, H, R, d).requires_grad_() for _ in range(3)]
    kept = {}
    for backend in ("sdpa", "split"):
        seen = {}

        def keep(t, seen=seen):
            seen[t.untyped_storage().data_ptr()] = (t.shape, t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            shared_prompt_attention(*ins, backend=backend)
        kept[backend] = seen.values()
    assert not any(P + R in shape for shape, _ in kept["split"])
    saved = {k: sum(n for _, n in v) for k, v in kept.items()}
    assert saved["sdpa"] - saved["split"] >= (N - 1) * 2 * H * P * d * 4


def test_auto_takes_the_split_on_cpu_where_the_prompt_is_long(monkeypatch):
    """The split where the prompt's copies are worth saving (a prompt of 128 tokens or more
    and at least twice a response), SDPA where not."""
    from rlpost.kernels.ops.shared_prompt import split

    taken = []
    real = split.shared_prompt_attention_split
    monkeypatch.setattr(
        split, "shared_prompt_attention_split", lambda *a: taken.append(a) or real(*a)
    )
    for P, R in ((128, 64), (300, 8), (127, 8), (128, 65), (64, 64)):
        ins = [torch.randn(2, P, 4)] * 3 + [torch.randn(3, 2, R, 4)] * 3
        shared_prompt_attention(*ins)
    assert [a[0].shape[1] for a in taken] == [128, 300]


def _rel_err(x, truth):
    return float((x.double() - truth).abs().max() / truth.abs().max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_on_cuda():
    """float32: IEEE products (no silent TF32), outputs and all six gradients."""
    g = torch.Generator(device="cuda").manual_seed(0)
    N, H, P, R, d = 8, 4, 256, 64, 64

    def t(*shape):
        return torch.randn(*shape, generator=g, device="cuda").requires_grad_()

    ins = (t(H, P, d), t(H, P, d), t(H, P, d), t(N, H, R, d), t(N, H, R, d), t(N, H, R, d))
    tri = _outputs_and_grads(ins, "triton")
    ref = _outputs_and_grads(ins, "reference")
    for a, b in zip(tri, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_on_cuda_bfloat16():
    """bfloat16 inputs at a real head size (d=128): the Triton outputs and gradients are as
    close to the float64 truth (same bf16-valued inputs) as the torch reference's."""
    g = torch.Generator(device="cuda").manual_seed(0)
    N, H, P, R, d = 4, 4, 300, 100, 128

    def t(*shape):
        x = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
        return x.requires_grad_()

    ins = (t(H, P, d), t(H, P, d), t(H, P, d), t(N, H, R, d), t(N, H, R, d), t(N, H, R, d))
    truth = _outputs_and_grads([x.detach().double().requires_grad_() for x in ins], "reference")
    tri = _outputs_and_grads(ins, "triton")
    ref = _outputs_and_grads(ins, "reference")
    assert all(x.dtype == torch.bfloat16 for x in tri)
    errs = [(_rel_err(a, t_), _rel_err(b, t_)) for a, b, t_ in zip(tri, ref, truth, strict=True)]
    assert all(e_tri <= max(2 * e_ref, 1e-2) for e_tri, e_ref in errs), errs


def test_concat_rows_takes_lists_and_other_rows_end_to_end():
    """Rows of any kind (lists at C speed; tuples, tensors and numpy rows element by
    element) end to end, as int64 or float64; no rows, an empty tensor of the dtype."""
    import numpy as np

    from rlpost.kernels.ops.shared_prompt import concat_rows

    rows = [[1, 2], (3,), torch.tensor([4, 5]), np.array([6]), [], [np.int64(7)]]
    got = concat_rows(rows)
    assert got.dtype == torch.long and got.tolist() == [1, 2, 3, 4, 5, 6, 7]
    f = concat_rows([[0.1, -2.5], (1,)], torch.float64)
    assert f.dtype == torch.float64 and f.tolist() == [0.1, -2.5, 1.0]
    assert concat_rows([]).shape == (0,) and concat_rows([[]], torch.float64).dtype == torch.float64


def test_pad_rows_pads_on_either_side_by_hand():
    from rlpost.kernels.ops.shared_prompt import pad_rows

    right, real = pad_rows([[1, 2, 3], [4], []], fill=9)
    assert right.tolist() == [[1, 2, 3], [4, 9, 9], [9, 9, 9]]
    assert real.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    left, real = pad_rows([[1, 2], (3,)], fill=0, left=True, width=3)
    assert left.tolist() == [[0, 1, 2], [0, 0, 3]] and real.tolist() == [[0, 1, 1], [0, 0, 1]]
    f, _ = pad_rows([[0.5]], 0.0, torch.float64, width=2)
    assert f.dtype == torch.float64 and f.tolist() == [[0.5, 0.0]]
