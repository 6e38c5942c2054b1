"""The HF rollout engine: left padding, engine log-probs, stop strings, finish reasons."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from rlpost.llm.model import tiny
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.rollout.engines import RolloutBatch, RolloutEngine, SamplingParams, make_vllm_engine
from rlpost.llm.rollout.engines.fake import FakeEngine
from rlpost.llm.rollout.engines.hf import HFEngine


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    return Qwen2ForCausalLM(tiny.tiny_config(tok)).eval(), tok


def ids(tok, s):
    return tok(s, add_special_tokens=False).input_ids


def test_engines_satisfy_the_protocol(model_tok):
    m, tok = model_tok
    assert isinstance(HFEngine(m, tok), RolloutEngine)
    assert isinstance(FakeEngine(lambda p, n: []), RolloutEngine)


def test_batched_left_padding_equals_one_prompt_at_a_time(model_tok):
    m, tok = model_tok
    eng = HFEngine(m, tok)
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    prompts = [ids(tok, "7+5="), ids(tok, "123+456="), ids(tok, "9=")]
    together = eng.generate(prompts, 1, greedy)
    for i, p in enumerate(prompts):
        alone = eng.generate([p], 1, greedy)
        n = int(alone.lengths[0])
        assert together.completion_ids[i, :n].tolist() == alone.completion_ids[0, :n].tolist()
        torch.testing.assert_close(
            together.logprobs[i, :n], alone.logprobs[0, :n], atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_trainer_recomputation(model_tok, temperature):
    m, tok = model_tok
    torch.manual_seed(1)
    b = HFEngine(m, tok).generate(
        [ids(tok, "12+3="), ids(tok, "456+78=")], 3, SamplingParams(6, temperature)
    )
    assert b.completion_ids.shape[0] == 6 and b.group.tolist() == [0, 0, 0, 1, 1, 1]
    with torch.no_grad():
        lp, _ = completion_logprobs(
            m, make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id), temperature
        )
    torch.testing.assert_close(lp * b.mask, b.logprobs, atol=1e-5, rtol=1e-5)
    assert (b.logprobs[b.mask == 0] == 0).all()


def test_finish_reasons_and_eos_kept(model_tok):
    m, tok = model_tok
    eos = tok.eos_token_id
    eng = HFEngine(m, tok)
    assert eng._truncate([5, 6, eos, 0, 0], SamplingParams())[0] == [5, 6, eos]
    assert eng._truncate([5, 6, eos], SamplingParams())[1] == "stop"
    assert eng._truncate([5, 6, 7], SamplingParams())[1] == "length"


def test_stop_strings_cut_after_the_stop(model_tok):
    m, tok = model_tok
    eng = HFEngine(m, tok)
    toks = ids(tok, "12=34=5")
    cut, reason = eng._truncate(toks, SamplingParams(stop=("=",)))
    assert tok.decode(cut) == "12=" and reason == "stop"
    # and end to end: no completion contains text past its first stop string
    b = eng.generate([ids(tok, "1+1")], 8, SamplingParams(8, 1.0, stop=("+",)))
    for i in range(len(b)):
        text = tok.decode(b.completion_ids[i, : int(b.lengths[i])].tolist())
        assert "+" not in text[:-1]
        assert (b.finish_reasons[i] == "stop") == (
            text.endswith("+") or text.endswith(tok.eos_token)
        )


def test_rollout_batch_select_and_concat():
    def script(p, n):
        return [([1 + i] * (i + 1), [-0.5] * (i + 1), "stop") for i in range(n)]

    a = FakeEngine(script).generate([[1], [2]], 2, SamplingParams())
    b = FakeEngine(script).generate([[3]], 3, SamplingParams())
    c = RolloutBatch.concat([a, b])
    assert c.completion_ids.shape == (7, 3) and c.group.tolist() == [0, 0, 1, 1, 2, 2, 2]
    s = c.select([2, 3, 6])
    assert s.group.tolist() == [0, 0, 1] and s.prompt_ids == [[2], [2], [3]]
    assert s.mask.sum(1).tolist() == [1.0, 2.0, 3.0]


def test_vllm_engine_missing_gives_an_actionable_error():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"\[vllm\] extra"):
            make_vllm_engine("some/path")
    else:  # a GPU environment with vLLM: covered by the gpu-marked tests
        assert callable(make_vllm_engine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprobs_equal_the_logits_path_with_gradients(model_tok, temperature):
    """The fused kernel path (decoder hidden states + LM-head weight) gives the same
    log-probs, entropies and parameter gradients as the model's own logits."""
    from rlpost.llm.model.policy import fused_head

    m, tok = model_tok
    assert fused_head(m) is not None  # Qwen2: plain tied linear head
    torch.manual_seed(2)
    b = HFEngine(m, tok).generate(
        [ids(tok, "12+3="), ids(tok, "4+5=")], 2, SamplingParams(5, temperature)
    )
    sb = make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id)
    res = {}
    for impl in ("fused", "logits"):
        m.zero_grad(set_to_none=True)
        lp, ent = completion_logprobs(m, sb, temperature, impl=impl)
        ((lp * b.mask).sum() + 0.1 * (ent * b.mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        res[impl] = (lp * b.mask, ent * b.mask, grads)
    m.zero_grad(set_to_none=True)
    torch.testing.assert_close(res["fused"][0], res["logits"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res["fused"][1], res["logits"][1], atol=1e-5, rtol=1e-5)
    assert res["fused"][2].keys() == res["logits"][2].keys()
    for name, g in res["fused"][2].items():
        torch.testing.assert_close(g, res["logits"][2][name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("impl", ["fused", "logits"])
def test_contiguous_rows_run_causally_and_equal_each_sequence_alone(model_tok, impl, monkeypatch):
    """Rows of different prompt lengths (left padding) and completion lengths (right
    padding) run shifted, under plain causal attention with no mask: their log-probs,
    entropies and parameter gradients equal each sequence's own unpadded forward."""
    from rlpost.core.logprobs import logprobs_and_entropy

    m, tok = model_tok
    torch.manual_seed(4)
    b = HFEngine(m, tok).generate(
        [ids(tok, "12+3="), ids(tok, "4567+8=")], 3, SamplingParams(6, 1.0)
    )
    lengths = b.mask.sum(1).long()
    assert len(set(lengths.tolist())) > 1 and len({len(p) for p in b.prompt_ids}) == 2
    sb = make_seq_batch(b.prompt_ids, b.completion_ids, b.mask, b.pad_id)
    sdpa, masks = torch.nn.functional.scaled_dot_product_attention, []

    def recording(*args, **kwargs):
        masks.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    m.zero_grad(set_to_none=True)
    lp, ent = completion_logprobs(m, sb, 0.7, impl=impl)
    ((lp * b.mask).sum() + 0.1 * (ent * b.mask).sum()).backward()
    got = {n: p.grad.clone() for n, p in m.named_parameters()}
    monkeypatch.undo()
    assert masks and all(mask is None and causal for mask, causal in masks)

    m.zero_grad(set_to_none=True)
    total = 0.0
    for i, prompt in enumerate(b.prompt_ids):
        n = int(lengths[i])
        seq = torch.tensor([prompt + b.completion_ids[i, :n].tolist()])
        logits = m(input_ids=seq).logits[:, len(prompt) - 1 : len(prompt) - 1 + n]
        res = logprobs_and_entropy(logits, b.completion_ids[i : i + 1, :n], temperature=0.7)
        torch.testing.assert_close(lp[i, :n], res.logp[0].detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent[i, :n], res.entropy[0].detach(), atol=1e-5, rtol=1e-5)
        total = total + res.logp.sum() + 0.1 * res.entropy.sum()
    total.backward()
    for name, p in m.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)
    m.zero_grad(set_to_none=True)


def test_only_rows_attending_one_contiguous_run_are_shifted():
    from rlpost.llm.model.policy import contiguous_rows

    rows = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    assert contiguous_rows(rows).tolist() == [2, 0, 1]
    holed = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0]])  # an unattended token inside
    assert contiguous_rows(holed) is None
    assert contiguous_rows(torch.tensor([[0, 0, 0], [1, 1, 0]])) is None  # an empty row


def test_an_empty_prompt_keeps_the_masked_layout(model_tok, monkeypatch):
    """A row with no prompt has nothing to predict its first token from in the shifted
    layout (its prediction would start before the row): the batch keeps the mask."""
    from rlpost.llm.model import policy

    m, tok = model_tok
    sb = make_seq_batch([ids(tok, "1+2="), []], torch.tensor([[5, 6], [7, 8]]), torch.ones(2, 2), 0)
    assert policy.contiguous_rows(sb.attention_mask) is not None  # (contiguous, but offset P)
    monkeypatch.setattr(policy, "_causal_logprobs", lambda *a, **k: pytest.fail("shifted"))
    lp, _ = completion_logprobs(m, sb, 1.0)
    assert torch.isfinite(lp).all()


def test_fused_path_refuses_a_head_it_cannot_express(model_tok):
    from rlpost.llm.model.policy import fused_head

    m, tok = model_tok

    class Capped(torch.nn.Module):  # e.g. Gemma-style logit soft-capping
        config = type("C", (), {"final_logit_softcapping": 30.0})()

        def __init__(self):
            super().__init__()
            self.inner = m

        def get_decoder(self):
            return m.get_decoder()

        def get_output_embeddings(self):
            return m.get_output_embeddings()

    assert fused_head(Capped()) is None
    sb = make_seq_batch([ids(tok, "1=")], torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2), 0)
    with pytest.raises(ValueError, match="fused"):
        completion_logprobs(Capped(), sb, impl="fused")


@pytest.mark.parametrize("layout", ["ragged", "uniform", "auto"])
@pytest.mark.parametrize("impl", ["fused", "logits"])
def test_packed_shared_prompt_logprobs_equal_the_unpacked_layout(model_tok, impl, layout):
    """Groups packed as [prompt; r_1; ...; r_N] (ragged: each response at its own length,
    several groups per row; uniform: one group per row) give the same log-probs, entropies
    and parameter gradients as one padded sequence per response."""
    m, tok = model_tok
    torch.manual_seed(3)
    b = HFEngine(m, tok).generate(
        [ids(tok, "12+3="), ids(tok, "4567+8=")], 3, SamplingParams(5, 1.0)
    )
    rows = [0, 1, 3, 4, 5]  # one group split: rows of a prompt need not all be present
    sub = b.select(torch.tensor(rows))
    res = {}
    for pack in (False, True):
        m.zero_grad(set_to_none=True)
        sb = make_seq_batch(
            sub.prompt_ids, sub.completion_ids, sub.mask, sub.pad_id, pack=pack, layout=layout
        )
        lp, ent = completion_logprobs(m, sb, 1.0, impl=impl)
        ((lp * sub.mask).sum() + 0.1 * (ent * sub.mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        res[pack] = (lp * sub.mask, ent * sub.mask, grads)
    m.zero_grad(set_to_none=True)
    torch.testing.assert_close(res[True][0], res[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res[True][1], res[False][1], atol=1e-5, rtol=1e-5)
    for name, g in res[True][2].items():
        torch.testing.assert_close(g, res[False][2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_forward_uses_the_shared_prompt_attention_function(model_tok, monkeypatch):
    """The packed forward of a transformers model goes through the shared-prompt attention
    kernel op (not the dense 4D mask), and the model's attention setting is restored."""
    import rlpost.kernels.ops.shared_prompt as sp
    from rlpost.llm.model import packing

    m, tok = model_tok
    assert packing.supports_shared_attention(m)
    calls = []
    real = sp.shared_prompt_attention
    monkeypatch.setattr(
        sp, "shared_prompt_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    before = m.config._attn_implementation
    comp = torch.tensor([[5, 6, 7], [8, 9, 10]])
    sb = make_seq_batch(
        [ids(tok, "1+2=")] * 2, comp, torch.ones(2, 3), 0, pack=True, layout="uniform"
    )
    with torch.no_grad():
        completion_logprobs(m, sb, 1.0)
    assert len(calls) == m.config.num_hidden_layers  # one packed row, every layer
    assert m.config._attn_implementation == before
    assert sb.packed._allow is None  # the [G, T, T] mask was never built: nothing read it
    want = torch.ones(len(sb.packed.input_ids[0]), len(sb.packed.input_ids[0])).tril().bool()
    assert sb.packed.allow.shape == (1, *want.shape) and sb.packed._allow is not None
    [(P, N, R)] = sb.packed.layout  # (each response without its last token: R = 2)
    a = sb.packed.allow[0]
    assert N == R == 2 and len(ids(tok, "1+2=")) == P and a[:P, :P].equal(want[:P, :P])
    assert a[P + R : P + 2 * R, :P].all() and not a[P + R : P + 2 * R, P : P + R].any()


def test_a_long_shared_prompt_packs_through_the_split_and_equals_the_unpacked(monkeypatch):
    """A prompt long enough for the shared-prompt op's CPU split backend (two flash
    attentions merged by log-sum-exp): two groups of uneven size in the uniform layout (the
    shorter row padded) give the log-probs, entropies and every parameter gradient of one
    padded sequence per response, and every layer of every row went through the split."""
    from rlpost.kernels.ops.shared_prompt import split

    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    m = Qwen2ForCausalLM(tiny.tiny_config(tok, positions=256)).train()
    taken = []
    real = split.shared_prompt_attention_split
    monkeypatch.setattr(
        split, "shared_prompt_attention_split", lambda *a: taken.append(1) or real(*a)
    )
    g = torch.Generator().manual_seed(1)
    long = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in (150, 140)]
    prompts = [long[0]] * 3 + [long[1]] * 2
    comp = torch.randint(3, len(tok), (5, 12), generator=g)
    mask = torch.ones(5, 12)
    mask[1, 9:] = 0  # an early-finished response
    res = {}
    for pack in (False, True):
        m.zero_grad(set_to_none=True)
        sb = make_seq_batch(prompts, comp, mask, tok.pad_token_id, pack=pack, layout="uniform")
        lp, ent = completion_logprobs(m, sb, 1.0)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        res[pack] = (lp * mask, ent * mask, grads)
    assert len(taken) == 2 * m.config.num_hidden_layers  # both packed rows, every layer
    torch.testing.assert_close(res[True][0], res[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res[True][1], res[False][1], atol=1e-5, rtol=1e-5)
    assert res[True][2].keys() == res[False][2].keys()
    for name, grad in res[True][2].items():
        torch.testing.assert_close(grad, res[False][2][name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("layout", ["ragged", "uniform"])
def test_packed_logprobs_with_lora_adapters_on_and_off(model_tok, layout):
    """PEFT-wrapped policies (and their adapter-free reference) pack the same way."""
    import copy

    from peft import LoraConfig, get_peft_model

    m, tok = model_tok
    torch.manual_seed(4)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    pm = get_peft_model(copy.deepcopy(m), lora)
    comp = torch.randint(3, m.config.vocab_size, (3, 4))
    prompts = [ids(tok, "12+3=")] * 3
    out = {}
    for pack in (False, True):
        sb = make_seq_batch(
            prompts, comp, torch.ones(3, 4), tok.pad_token_id, pack=pack, layout=layout
        )
        with torch.no_grad():
            on = completion_logprobs(pm, sb, 1.0)[0]
            with pm.disable_adapter():
                off = completion_logprobs(pm, sb, 1.0)[0]
        out[pack] = (on, off)
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-5, rtol=1e-5)
    assert (out[True][0] - out[True][1]).abs().max() > 1e-3  # the adapters matter


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("layout", ["ragged", "ragged-by-sequence", "uniform"])
def test_packed_logprobs_under_gradient_checkpointing_equal_the_plain_backward(
    model_tok, layout, reentrant
):
    """With activation checkpointing on (either torch flavour), the backward recomputes
    each layer the way the forward ran it: through the shared-prompt attention function in
    the uniform layout (and the ragged one's, densely or by sequence), not through the
    model's default attention after the forward's mode has ended. Same log-probs, same
    parameter gradients as without checkpointing."""
    import copy

    m, tok = model_tok
    torch.manual_seed(5)
    comp = torch.randint(3, m.config.vocab_size, (4, 5))
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    prompts = [ids(tok, "12+3=")] * 2 + [ids(tok, "4567+8=")] * 2
    sb = make_seq_batch(prompts, comp, mask, tok.pad_token_id, pack=True,
                        layout=layout.removesuffix("-by-sequence"))  # fmt: skip
    sb.packed.sequences = layout == "ragged-by-sequence"  # (forced: these rows are short)
    out = {}
    for ckpt in (False, True):
        mc = copy.deepcopy(m).train()
        if ckpt:
            mc.gradient_checkpointing_enable({"use_reentrant": reentrant})
        lp, _ = completion_logprobs(mc, sb, 1.0)
        (lp * mask).sum().backward()
        out[ckpt] = (lp.detach(), {n: p.grad for n, p in mc.named_parameters()})
        assert mc.config._attn_implementation == m.config._attn_implementation
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-6, rtol=1e-6)
    for name, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], g, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("form", ["dense", "by-sequence", "by-sequence-whole"])
@pytest.mark.parametrize("impl", ["fused", "logits"])
def test_ragged_rows_attend_densely_or_by_sequence_equal_to_the_unpacked(
    model_tok, monkeypatch, impl, form
):
    """The ragged layout's attention, forced each way: densely in each packed row under
    its mask; each response's ``[prompt; response]`` gathered into its own right-padded
    causal sequence, over the same rows; and built for that (``sequences``: the groups
    whole, no dense mask). Three groups of different prompt lengths share rows, with an
    early-finished response and one of a single token (no token of its own in the input:
    its sequence is the prompt alone, and it is its group's first). Log-probs, entropies
    and every parameter's gradient equal one padded sequence per response, and the forced
    path is the one taken in every layer."""
    import rlpost.kernels.ops.shared_prompt.reference as reference
    import rlpost.llm.model.packing as packing

    m, tok = model_tok
    by_sequence = form != "dense"
    monkeypatch.setattr(reference, "attends_by_sequence", lambda *a: by_sequence)
    taken, real = [], packing._attend  # per attention call: by sequence (no mask) or not
    monkeypatch.setattr(packing, "_attend", lambda *a: taken.append(a[4] is None) or real(*a))
    g = torch.Generator().manual_seed(6)
    prompts = [ids(tok, "9=")] * 2 + [ids(tok, "12+3=")] * 3 + [ids(tok, "4567+8=")] * 2
    comp = torch.randint(3, m.config.vocab_size, (7, 6), generator=g)
    lengths = torch.tensor([1, 5, 6, 2, 6, 4, 3])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    res = {}
    for pack in (False, True):
        m.zero_grad(set_to_none=True)
        sb = make_seq_batch(prompts, comp, mask, 0, pack=pack, layout="ragged",
                            sequences=form == "by-sequence-whole")  # fmt: skip
        if pack and form == "by-sequence":  # (the split rows, with their mask, by sequence)
            sb.packed.sequences = True
        lp, ent = completion_logprobs(m, sb, 1.0, impl=impl)
        ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        res[pack] = (lp * mask, ent * mask, grads)
    m.zero_grad(set_to_none=True)
    layers = m.config.num_hidden_layers  # (a call per length bucket by sequence)
    assert set(taken) == {by_sequence} and len(taken) % layers == 0
    assert len(taken) >= layers if by_sequence else len(taken) == layers
    assert (sb.packed.allow is None) == (form == "by-sequence-whole")
    torch.testing.assert_close(res[True][0], res[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res[True][1], res[False][1], atol=1e-5, rtol=1e-5)
    assert res[True][2].keys() == res[False][2].keys()
    for name, grad in res[True][2].items():
        torch.testing.assert_close(grad, res[False][2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_ragged_rows_built_to_attend_by_sequence_keep_long_groups_whole(model_tok):
    """A group too long for one dense row is split, its prompt repeated, to keep the dense
    masks small; built for a model that attends by sequence (``sequences``), where the
    rule takes it, the group stays whole, its prompt once and no dense mask built. The
    plan (``packed_work``) counts what is built, and log-probs and every gradient equal
    the padded layout."""
    from rlpost.kernels.ops.shared_prompt import pack_groups, packed_work
    from rlpost.llm.model.policy import ROW_TOKENS

    m, tok = model_tok
    g = torch.Generator().manual_seed(7)
    prompts = [ids(tok, "12+3=")] * 6 + [ids(tok, "45+6=")] * 2
    comp = torch.randint(3, m.config.vocab_size, (8, 90), generator=g)
    lengths = torch.randint(60, 91, (8,), generator=g)
    mask = (torch.arange(90)[None] < lengths[:, None]).float()
    kept = int(lengths.sum()) - 8  # (each response's last token is not an input)
    built = {}
    for sequences in (False, True):
        pk = pack_groups(prompts, comp, 0, lengths, ROW_TOKENS, False, sequences)
        plan = packed_work(prompts, 90, lengths, ROW_TOKENS, False, sequences)
        assert plan[0] == sum(pk.tokens)
        built[sequences] = pk
    split, whole = built[False], built[True]
    assert split.allow is not None and not split.sequences
    assert whole.allow is None and whole.sequences
    assert sum(whole.tokens) == 2 * 5 + kept < sum(split.tokens)  # each prompt once
    res = {}
    for pack in (False, True):
        m.zero_grad(set_to_none=True)
        sb = make_seq_batch(prompts, comp, mask, 0, pack=pack, layout="ragged", sequences=True)
        lp, _ = completion_logprobs(m, sb, 1.0)
        (lp * mask).sum().backward()
        res[pack] = (lp * mask, {n: p.grad.clone() for n, p in m.named_parameters()})
    m.zero_grad(set_to_none=True)
    torch.testing.assert_close(res[True][0], res[False][0], atol=1e-5, rtol=1e-5)
    for name, grad in res[True][1].items():
        torch.testing.assert_close(grad, res[False][1][name], atol=1e-5, rtol=1e-4, msg=name)
    # the trainer's forwards build for it: a transformers model attends by sequence
    from rlpost.llm.config import load_config
    from rlpost.llm.train.forward import Forwards

    cfg = load_config(None, ["model.pack_layout=ragged"])
    batch = RolloutBatch(prompts, comp, torch.zeros(8, 90), mask, ["stop"] * 8, torch.zeros(8), 0)
    fw = Forwards(cfg, type("Learner", (), {"sharded": False})(), m, 1.0, None)
    assert fw.seq_batch(batch).packed.sequences


def test_a_model_without_attention_interface_refuses_a_layout_built_by_sequence(model_tok):
    """A layout built to attend by sequence has no dense mask: a model whose attention
    cannot be swapped gets a one-line error naming the fix, not a crash in the mask."""
    m, tok = model_tok

    class Plain(torch.nn.Module):  # (no config, no AttentionInterface)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    prompts = [ids(tok, "12+3=")] * 6
    comp = torch.randint(3, m.config.vocab_size, (6, 90))
    sb = make_seq_batch(prompts, comp, torch.ones(6, 90), 0, pack=True, layout="ragged",
                        sequences=True)  # fmt: skip
    assert sb.packed.sequences and sb.packed.allow is None
    with pytest.raises(ValueError, match=r"cannot attend by sequence.*sequences=False"):
        completion_logprobs(Plain(m), sb, 1.0, impl="logits")


def test_flat_rows_by_sequence_maps_every_slot_by_hand():
    """Two packed rows of 6 slots holding 5 and 3 real tokens; responses A = [prompt 0, 1;
    2, 3], B = [prompt 0, 1; 4] share row 0, C = [prompt 6; 7, 8] fills row 1. All three
    fit one length bucket (3 >= 0.75 x 4), longest first: each slot reads its real token
    (flat index, padding 0), and each real token's output is its first occurrence's slot
    (the shared prompt's: A's); a slot no sequence holds gets -1."""
    from rlpost.llm.model.packing import flat_rows

    rows = flat_rows([5, 3], 6, None, [[0, 1, 2, 3], [0, 1, 4], [6, 7, 8]])
    assert rows.keep.tolist() == [0, 1, 2, 3, 4, 6, 7, 8]
    assert [b.tolist() for b in rows.buckets] == [[[0, 1, 2, 3], [0, 1, 4, 0], [5, 6, 7, 0]]]
    assert rows.seq_out.tolist() == [0, 1, 2, 3, 6, 8, 9, 10]
    # two buckets (2 < 0.75 x 4): the short sequence's slots count after the first bucket's
    rows = flat_rows([5, 3], 6, None, [[6, 7], [0, 1, 2, 3], [0, 1, 4]])
    assert [b.tolist() for b in rows.buckets] == [[[0, 1, 2, 3], [0, 1, 4, 0]], [[5, 6]]]
    assert rows.seq_out.tolist() == [0, 1, 2, 3, 6, 8, 9, -1]


def test_ragged_packed_forward_computes_no_padding(model_tok):
    """The ragged layout in a transformers model: the decoder's per-token layers take the
    packed rows' real tokens end to end (no padded position), and the attention setting is
    restored after."""
    m, tok = model_tok
    comp = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0], [11, 0, 0, 0]])
    mask = (comp > 0).float()
    prompts = [ids(tok, "1+2=")] * 2 + [ids(tok, "34+5=")]
    sb = make_seq_batch(prompts, comp, mask, 0, pack=True, layout="ragged")
    seen = []
    hook = m.model.embed_tokens.register_forward_hook(lambda mod, a, out: seen.append(a[0]))
    before = m.config._attn_implementation
    try:
        with torch.no_grad():
            lp, _ = completion_logprobs(m, sb, 1.0)
    finally:
        hook.remove()
    # each response without its last token (it predicts nothing), each prompt once
    assert seen[0].shape == (1, sum(sb.packed.tokens)) == (1, 4 + 3 + 1 + 5 + 0)
    assert sb.packed.input_ids.numel() > seen[0].numel()  # the padded rows had padding
    assert m.config._attn_implementation == before
    ref, _ = completion_logprobs(m, make_seq_batch(prompts, comp, mask, 0), 1.0)
    torch.testing.assert_close(lp * mask, ref * mask, atol=1e-5, rtol=1e-5)


def test_packing_is_skipped_where_it_saves_too_few_positions(model_tok):
    """``min_gain`` (``model.pack_min_gain``): short prompts and full-length responses
    leave packing little to save, and the padded layout is kept; a long shared prompt is
    still packed. The trainer's forwards pass the configured gain."""
    from rlpost.llm.config import load_config
    from rlpost.llm.train.forward import Forwards

    m, tok = model_tok
    short, full = [ids(tok, "1+2=")] * 4, torch.randint(3, 12, (4, 32))
    ones = torch.ones(4, 32)
    assert make_seq_batch(short, full, ones, 0, pack=True, min_gain=1.2).packed is None
    assert make_seq_batch(short, full, ones, 0, pack=True).packed is not None  # (0: always)
    long = [ids(tok, "12+34=" * 8)] * 4  # 48 prompt tokens shared by 4 responses
    assert make_seq_batch(long, full, ones, 0, pack=True, min_gain=1.2).packed is not None
    cfg = load_config(None, ["model.pack_min_gain=1.2"])
    batch = RolloutBatch(short, full, torch.zeros(4, 32), ones, ["length"] * 4, torch.zeros(4), 0)
    fw = Forwards(cfg, type("Learner", (), {"sharded": False})(), m, 1.0, None)
    assert fw.seq_batch(batch).packed is None


def test_the_cost_model_counts_what_the_built_layouts_hold():
    """``packed_work`` (the plan, before anything is built) equals the positions and pairs
    of the layouts ``pack_groups`` builds: the ragged rows' real tokens and ``T^2`` per
    row (dense); built for a model that attends by sequence (``sequences``), where the
    sequences are long and it halves the dense rows' pairs, the groups whole and the
    causal pairs of every response's ``[prompt; response]`` padded to the longest of its
    length bucket; the uniform rows' prompt once plus each padded response. A planner
    that drifted from the builder (a split, a dropped last token) fails here."""
    from rlpost.kernels.ops.shared_prompt import length_buckets, pack_groups, packed_work

    g = torch.Generator().manual_seed(0)
    prompts = [[5] * 40] * 6 + [[6, 7, 8]] * 5 + [[9] * 70] * 3
    comp = torch.randint(3, 12, (14, 24), generator=g)
    lengths = torch.randint(1, 25, (14,), generator=g)
    chose = set()
    long_comp = torch.randint(3, 12, (14, 96), generator=g)
    cases = [(lengths, comp), (lengths.clamp(max=2), comp), (torch.full((14,), 96), long_comp)]
    for lens, completions in cases:
        L = completions.shape[1]
        split, built = (pack_groups(prompts, completions, 0, lens, 128, False, sequences)
                        for sequences in (False, True))  # fmt: skip
        T, lens_seq = split.input_ids.shape[1], [len(s) for s in split.seqs]
        assert lens_seq == [len(s) for s in built.seqs]  # (a sequence is the same either way)
        buckets = length_buckets(lens_seq)
        assert sorted(b for bucket in buckets for b in bucket) == list(range(14))
        dense = len(split.tokens) * T * T
        by_seq = sum(len(b) * lens_seq[b[0]] * (lens_seq[b[0]] + 1) / 2 for b in buckets)
        long = sum(lens_seq) >= 64 * 14  # (MIN_SEQUENCE tokens a sequence on average)
        assert built.sequences == (long and 2 * by_seq <= dense)  # (SEQUENCE_GAIN)
        assert not split.sequences
        chose.add(built.sequences)
        assert packed_work(prompts, L, lens, 128, False) == (sum(split.tokens), dense)
        assert packed_work(prompts, L, lens, 128, False, True) == (
            sum(built.tokens),
            by_seq if built.sequences else dense,
        )
        for pk in (split, built):  # each sequence: its prompt's slots, then its own tokens
            ids_flat = pk.input_ids.view(-1)
            for b, seq in enumerate(pk.seqs):
                k = int(lens[b]) - 1  # (the last token is not an input)
                assert ids_flat[seq].tolist() == prompts[b] + completions[b, :k].tolist()
    pk = pack_groups(prompts, comp, 0, None, row_tokens=128, last_token=False)
    positions, pairs = packed_work(prompts, 24, None, row_tokens=128, last_token=False)
    assert positions == sum(P + N * R for P, N, R in pk.layout)
    assert pairs == sum(P * (P + 1) / 2 + N * R * (P + R) for P, N, R in pk.layout)
    assert sum(split.tokens) > sum(built.tokens)  # (full-length: split, its prompts repeated)
    assert chose == {False, True}  # short responses: densely; full 96-token ones by sequence


def test_auto_layout_takes_the_cheaper_packing_per_micro_batch(model_tok):
    """``layout="auto"`` (the default, ``model.pack_layout``): a long prompt shared by many
    full responses goes uniform (the ragged rows would split it and repeat the prompt),
    short prompts with uneven responses go ragged, and short prompts with full responses
    stay padded; each gives the padded layout's log-probs."""
    from rlpost.llm.model.policy import decoder_cost, layout_costs

    m, tok = model_tok
    cost = decoder_cost(m)
    g = torch.Generator().manual_seed(1)
    long, comp = [ids(tok, "12+34=" * 8)] * 16, torch.randint(3, 12, (16, 24), generator=g)
    ones = torch.ones(16, 24)
    short = [ids(tok, f"{i}+1=") for i in range(4) for _ in range(4)]
    uneven = (torch.arange(24)[None] < torch.randint(2, 24, (16, 1), generator=g)).float()
    cases = {"uniform": (long, ones), "ragged": (short, uneven), "padded": (short, ones)}
    for want, (prompts, mask) in cases.items():
        sb = make_seq_batch(prompts, comp, mask, 0, pack=True, layout="auto", min_gain=1.2,
                            cost=cost)  # fmt: skip
        got = "padded" if sb.packed is None else "ragged" if sb.packed.layout is None else "uniform"
        costs = layout_costs(prompts, mask.sum(1).long(), 24, cost)
        assert got == want, costs
        S = max(len(p) for p in prompts) + 24  # the padded rows' positions and causal pairs
        assert costs["padded"] == 16 * (S * cost[0] + S * (S + 1) / 2 * cost[1])
        ref, _ = completion_logprobs(m, make_seq_batch(prompts, comp, mask, 0), 1.0)
        lp, _ = completion_logprobs(m, sb, 1.0)
        torch.testing.assert_close(lp * mask, ref * mask, atol=1e-5, rtol=1e-5)


def test_decoder_cost_is_twice_the_weights_and_the_attention_per_pair(model_tok):
    from rlpost.llm.model.policy import decoder_cost

    m, _ = model_tok
    c = m.config
    h, kv = c.hidden_size, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * c.intermediate_size + 2 * h
    weights = c.num_hidden_layers * layer + h  # (the final norm; embeddings tied, excluded)
    assert decoder_cost(m) == (2.0 * weights, 4.0 * h * c.num_hidden_layers)
    assert decoder_cost(torch.nn.Linear(2, 2)) == (1.0, 0.0)


def test_auto_layout_is_ragged_on_cuda():
    from rlpost.llm.model.policy import pack_layout

    cpu = torch.nn.Linear(2, 2)
    assert pack_layout("auto", cpu) == "auto" and pack_layout("uniform", cpu) == "uniform"

    class OnCuda:  # (no GPU needed: only the parameters' device is read)
        def parameters(self):
            return iter([type("P", (), {"device": torch.device("cuda", 0)})()])

    assert (
        pack_layout("auto", OnCuda()) == "ragged" and pack_layout("uniform", OnCuda()) == "uniform"
    )


def test_packed_attention_refuses_a_sliding_window_shorter_than_its_rows(model_tok):
    import copy

    m, tok = model_tok
    cfg = copy.deepcopy(m.config)
    cfg.use_sliding_window, cfg.sliding_window = True, 3
    cfg.max_window_layers = 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    sw = Qwen2ForCausalLM(cfg).eval()
    comp = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    sb = make_seq_batch([ids(tok, "1+2=")] * 2, comp, torch.ones(2, 4), 0, pack=True)
    with pytest.raises(ValueError, match=r"sliding_window=3.*pack_prompts=false"):
        completion_logprobs(sw, sb, 1.0)


def test_from_rows_pads_as_the_nested_lists_did_by_hand():
    """Two rows by hand (ids and log-probs right-padded, the mask over the real tokens),
    then random ragged rows (empty completions, log-probs shorter than the ids) against the
    nested-list construction from_rows replaced, value for value and dtype for dtype."""
    rows = [([1, 2], [5, 6, 7], [-0.5, -0.25, -1.0], "stop"), ([3], [8], [-2.0], "length")]
    b = RolloutBatch.from_rows(rows, n_prompts=1, n=2, pad_id=0)
    assert b.completion_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b.logprobs.tolist() == [[-0.5, -0.25, -1.0], [-2.0, 0.0, 0.0]]
    assert b.mask.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert b.group.tolist() == [0, 0] and b.prompt_ids == [[1, 2], [3]]

    def nested(rows, pad_id):
        L = max(1, max((len(r[1]) for r in rows), default=1))
        return (
            torch.tensor([[*r[1]] + [pad_id] * (L - len(r[1])) for r in rows], dtype=torch.long),
            torch.tensor([[*r[2]] + [0.0] * (L - len(r[2])) for r in rows]),
            torch.tensor([[1.0] * len(r[1]) + [0.0] * (L - len(r[1])) for r in rows]),
        )

    g = torch.Generator().manual_seed(0)
    for trial in range(50):
        rows = []
        for _ in range(int(torch.randint(1, 9, (1,), generator=g))):
            k = int(torch.randint(0, 12, (1,), generator=g))
            ids = torch.randint(0, 50_000, (k,), generator=g).tolist()
            lps = (torch.randn(k, generator=g, dtype=torch.float64) * 3).tolist()
            rows.append(([7], ids, lps[: k - trial % 2] if k else lps, "length"))
        b = RolloutBatch.from_rows(rows, n_prompts=len(rows), n=1, pad_id=3)
        for got, want in zip((b.completion_ids, b.logprobs, b.mask), nested(rows, 3), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), trial
    empty = RolloutBatch.from_rows([], n_prompts=0, n=4, pad_id=0)
    assert empty.completion_ids.shape == (0, 1) and empty.mask.dtype == torch.float32


def test_make_seq_batch_left_pads_prompts_as_the_nested_lists_did():
    """Prompts of different lengths (an empty one too) left-padded, ids and attention, by
    hand and then against the nested-list construction make_seq_batch replaced."""
    comp, mask = torch.tensor([[9, 8], [7, 0], [6, 5]]), torch.tensor([[1, 1], [1, 0], [1, 1]])
    sb = make_seq_batch([[1, 2, 3], [4], []], comp, mask, pad_id=0)
    assert sb.P == 3
    assert sb.input_ids.tolist() == [[1, 2, 3, 9, 8], [0, 0, 4, 7, 0], [0, 0, 0, 6, 5]]
    assert sb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    g = torch.Generator().manual_seed(1)
    for trial in range(30):
        B = int(torch.randint(1, 7, (1,), generator=g))
        prompts = [torch.randint(3, 50_000, (int(torch.randint(0, 9, (1,), generator=g)),),
                                 generator=g).tolist() for _ in range(B)]  # fmt: skip
        prompts[0] += [11]  # (at least one token somewhere)
        comp = torch.randint(3, 99, (B, 4), generator=g)
        sb = make_seq_batch(prompts, comp, torch.ones(B, 4), pad_id=2)
        P = max(map(len, prompts))
        left = torch.tensor([[2] * (P - len(p)) + p for p in prompts], dtype=torch.long)
        real = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
        assert torch.equal(sb.input_ids, torch.cat([left, comp], 1)), trial
        assert torch.equal(sb.attention_mask[:, :P], real) and sb.attention_mask.dtype == torch.long


def test_a_packed_forward_keeps_no_model_alive_whose_layers_reference_it():
    """The packed forward caches each model's checkpointable layers, keyed weakly by the
    model. Under FSDP2 every sharded layer's state references the root module and so the
    model: a strong list of layers in the cache then kept its own key, and the model, alive
    after the trainer was gone (a 2-rank FSDP2 run retained it). The back-reference here
    stands in for FSDP2's."""
    import gc
    import weakref

    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    m = Qwen2ForCausalLM(tiny.tiny_config(tok, size="micro"))
    for i in range(len(m.model.layers)):  # (not a submodule: a plain reference, as FSDP2's)
        m.model.layers[i].__dict__["_root"] = m
    sb = make_seq_batch(
        [ids(tok, "12+3=")] * 2, torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), 0,
        pack=True, layout="uniform",
    )  # fmt: skip
    lp, _ = completion_logprobs(m, sb, 1.0)
    lp.sum().backward()
    alive = weakref.ref(m)
    del m, lp
    gc.collect()
    assert alive() is None
