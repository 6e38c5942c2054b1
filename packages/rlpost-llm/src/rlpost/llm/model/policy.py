"""Policy models: loading (embedded default, local path, hub id), LoRA, the frozen
reference, and the trainer-side log-probs of sampled completions."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlpost.core.logprobs import logprobs_and_entropy

ROW_TOKENS = 128
"""Ragged packing: a group longer than ``max(ROW_TOKENS, 2 x its longest sequence)`` is
split into several packed sequences, its prompt repeated in each (the dense per-row mask
and attention stay small)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny_base_task(task: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The task whose tiny base a run on ``task`` starts from: its own, or, for a task
    learned only by RL (``base_task``: GRLO's conversation), that task's with its defaults."""
    from rlpost.llm.data.tasks import TASKS

    base = getattr(TASKS[task], "base_task", None)
    return (task, dict(params)) if base is None else (base, {})


def load_policy(cfg: Any, progress: bool = True, device: torch.device | None = None):
    """``(model, tokenizer)`` for ``cfg.model`` (LoRA applied when configured), on
    ``device`` when given (else where it was loaded: the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpost.llm.model import tiny

    path = cfg.model.path
    torch.manual_seed(cfg.run.seed)
    env = getattr(cfg.data, "env", None)  # (the preference and DLR configs have none)
    if path == "tiny" and env is not None:  # the environment's own tiny base
        from rlpost.llm.data.envs.pretrain import build_env_base

        model, tok = tiny.load_base(build_env_base(env.name, env.params, progress=progress))
    elif path in ("tiny", "tiny-bpe", "tiny-feedback", "tiny-reflect"):
        kind = "bpe" if path == "tiny-bpe" else "char"
        fb = 0.5 if path in ("tiny-feedback", "tiny-reflect") else None
        task, params = tiny_base_task(cfg.data.task, cfg.data.task_params)
        base = tiny.build_base(
            task, progress=progress, tokenizer=kind, feedback=fb,
            reflect=0.25 if path == "tiny-reflect" else None, **params,
        )  # fmt: skip
        model, tok = tiny.load_base(base)
    elif path == "tiny-random":
        tok = tiny.build_tokenizer()
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM(tiny.tiny_config(tok))
    else:
        from rlpost.llm.model.config import check_local_model

        try:  # (checked at load too; a config built in Python may skip that)
            check_local_model(path)
        except ValueError as exc:
            raise ValueError(f"model.path {exc}") from None
        try:
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=DTYPES[cfg.model.dtype], use_safetensors=True
            )
        except OSError as exc:  # not a folder, and the hub unreachable or without it
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"model.path {path!r}: cannot load it ({why})") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = model.to(DTYPES[cfg.model.dtype])
    if device is not None:
        model = model.to(device)
    if cfg.model.lora is not None:
        model = apply_lora(model, cfg.model.lora)
    if getattr(cfg.model, "train_layers", None) is not None:
        freeze_but_layers(model, cfg.model.train_layers)
    if getattr(cfg.model, "fused_ops", False):
        from rlpost.kernels.ops.rms_norm import fuse_rms_norms
        from rlpost.kernels.ops.swiglu import fuse_mlps

        fuse_rms_norms(model)
        fuse_mlps(model)
    return model, tok


def freeze_but_layers(model: torch.nn.Module, layers: list[int]) -> None:
    """Every weight frozen but those of the decoder layers ``layers`` (one line naming the
    bad index when the model has no such layer)."""
    n = int(getattr(model.config, "num_hidden_layers", 0))
    bad = [i for i in layers if not 0 <= i < n]
    if bad or not layers:
        raise ValueError(f"model.train_layers: {layers}: the model's decoder layers are 0..{n - 1}")
    keep = tuple(f".layers.{i}." for i in layers)
    for name, p in model.named_parameters():
        p.requires_grad_(any(k in f".{name}" for k in keep))


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def save_pretrained_files(model: torch.nn.Module, tokenizer, folder: Path) -> None:
    """What makes a checkpoint folder load with the field's own loaders, beside the
    trainer's ``model.safetensors``: for a full model its ``config.json`` and generation
    config (``AutoModelForCausalLM.from_pretrained(folder)`` then reads
    ``model.safetensors``); for LoRA the PEFT adapter (``adapter_config.json``,
    ``adapter_model.safetensors``: ``PeftModel.from_pretrained(base, folder)``); and the
    tokenizer (``AutoTokenizer.from_pretrained(folder)``)."""
    if is_peft(model):
        model.save_pretrained(str(folder))
    else:
        model.config.save_pretrained(str(folder))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def export_merged(model: torch.nn.Module, tokenizer, out: Path) -> Path:
    """A standalone Hugging Face model folder: LoRA adapters merged into the base."""
    out = Path(out)
    merged = model.merge_and_unload() if is_peft(model) else model
    merged.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def apply_lora(model: torch.nn.Module, lc) -> torch.nn.Module:
    """``model`` wrapped with PEFT LoRA adapters of a ``LoraConfig`` section."""
    import warnings

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
    )  # fmt: skip
    with warnings.catch_warnings():  # peft reads transformers' deprecated alias: not ours
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        return get_peft_model(model, config)


class Reference:
    """Frozen reference policy for the KL term: for LoRA the base with adapters disabled
    (no copy), otherwise a frozen copy of the initial weights."""

    def __init__(self, model: torch.nn.Module):
        self.lora = hasattr(model, "disable_adapter")
        self.model = model if self.lora else copy.deepcopy(model).eval().requires_grad_(False)

    @contextlib.contextmanager
    def active(self, policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
        if self.lora:
            with policy.disable_adapter():
                yield policy
        else:
            yield self.model


@dataclass
class SeqBatch:
    """Prompt + completion rows laid out for one forward: prompts left-padded to ``P``,
    completions right-padded to ``L``; ``input_ids`` ``[B, P + L]``."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    targets: Tensor  # [B, L] completion tokens
    P: int
    packed: Any = None  # rlpost.kernels.ops.shared_prompt.PackedGroups when packing
    shadow: Tensor | None = None  # [B, 1, S, S] bool: a compressed-KV sampler's attention


def make_seq_batch(
    prompt_ids: list[list[int]],
    completion_ids: Tensor,
    mask: Tensor,
    pad_id: int,
    pack: bool = False,
    layout: str = "ragged",
    attend: Tensor | None = None,
    kv: tuple[int, int] | None = None,
    min_gain: float = 0.0,
    cost: tuple[float, float] = (1.0, 0.0),
    sequences: bool = False,
) -> SeqBatch:
    """The padded layout; with ``pack`` also the shared-prompt packing of rows with equal
    prompts (one sequence ``[prompt; r_1; ...; r_N]`` per prompt, see
    :func:`rlpost.kernels.ops.shared_prompt.pack_groups`), which
    :func:`completion_logprobs` then uses instead: ``layout="ragged"`` keeps only each
    response's real tokens and attends through the model's own attention with a 4D mask;
    ``"uniform"`` pads every response to ``L`` for the shared-prompt attention op (fused
    flash attention on CPU, Triton on CUDA); ``"auto"`` takes whichever of the two costs less.
    ``attend``: the completion tokens attended to where they are more than the ``mask``
    (:attr:`RolloutBatch.attention`: a multi-turn episode's observations). ``kv``:
    ``(sink, window)`` of a compressed-KV sampler: the forward attends as it did
    (:func:`shadow_mask`; no packing). ``min_gain``: pack only when the padded layout costs
    at least that many times the packed one, counted before anything is built
    (:func:`layout_costs` with ``cost = (per position, per attended pair)``); below it the
    padded layout is kept (``model.pack_min_gain``). ``sequences``: the model can attend
    by sequence (:func:`rlpost.llm.model.packing.supports_shared_attention`), which the
    ragged layout then does where that pays (``pack_groups``)."""
    if layout not in ("ragged", "uniform", "auto"):
        raise ValueError(f"layout must be ragged, uniform or auto, got {layout!r}")
    from rlpost.kernels.ops.shared_prompt import pad_rows

    B, L = completion_ids.shape
    # the prompts left-padded at once, through one typed buffer (torch.tensor of nested
    # Python lists took 40 ms at 256 prompts of 128-256 tokens, every micro-batch)
    left, prompt_real = pad_rows(prompt_ids, pad_id, left=True)
    P = left.shape[1]
    ids = torch.cat([left, completion_ids.long()], 1)
    attn = torch.zeros(B, P + L, dtype=torch.long)
    attn[:, :P] = prompt_real
    real = attend if attend is not None else mask
    attn[:, P:] = real.long()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)  # positions count real tokens only (left pad)
    packed = shadow = None
    if kv is not None:
        shadow = shadow_mask(attn, P, *kv)
        pack = False
    if pack:
        lengths = real.sum(1).long()
        chosen, costs = layout, None
        if layout == "auto" or min_gain > 0:  # (else nothing to weigh: no cost counted)
            layouts = ("ragged", "uniform") if layout == "auto" else (layout,)
            costs = layout_costs(prompt_ids, lengths, L, cost, layouts, sequences)
            chosen = min(layouts, key=costs.get)
        if costs is None or costs["padded"] >= min_gain * costs[chosen]:
            from rlpost.kernels.ops.shared_prompt import pack_groups

            packed = pack_groups(
                prompt_ids,
                completion_ids,
                pad_id,
                lengths if chosen == "ragged" else None,
                row_tokens=ROW_TOKENS,
                last_token=False,  # (the last token of a response predicts nothing)
                sequences=sequences,
            )  # fmt: skip
    return SeqBatch(ids, attn, pos, completion_ids, P, packed, shadow)


def layout_costs(
    prompts: list[list[int]],
    lengths: Tensor,
    L: int,
    cost: tuple[float, float] = (1.0, 0.0),
    layouts: tuple[str, ...] = ("ragged", "uniform"),
    sequences: bool = False,
) -> dict[str, float]:
    """What a forward over each layout computes, ``per_position x positions + per_pair x
    attended (query, key) pairs`` with ``cost = (per_position, per_pair)``
    (:func:`decoder_cost`): the padded rows (``B (P + L)`` positions and the causal
    ``B (P + L)(P + L + 1) / 2`` pairs: they run without a mask, :func:`_causal_logprobs`)
    and each of ``layouts``, the ragged (attending by sequence where it can:
    ``sequences``) and the uniform packed ones
    (:func:`rlpost.kernels.ops.shared_prompt.packed_work`), counted before anything is
    built."""
    from rlpost.kernels.ops.shared_prompt import packed_work

    per_pos, per_pair = cost
    S = max(len(p) for p in prompts) + L
    out = {"padded": len(prompts) * (S * per_pos + S * (S + 1) / 2 * per_pair)}
    for name in layouts:
        lens = lengths if name == "ragged" else None
        positions, pairs = packed_work(prompts, L, lens, ROW_TOKENS, False, sequences)
        out[name] = positions * per_pos + pairs * per_pair
    return out


def pack_layout(layout: str, model: torch.nn.Module) -> str:
    """``model.pack_layout`` on ``model``'s device: ``auto`` is ``ragged`` on CUDA, where
    the uniform layout's Triton attention measured 3.8x slower than ragged on an H200
    (docs/gpu.md); elsewhere it stays ``auto`` (per micro-batch, by :func:`layout_costs`)."""
    params = next(iter(model.parameters()), None)
    on_cuda = params is not None and params.device.type == "cuda"
    return "ragged" if layout == "auto" and on_cuda else layout


def decoder_cost(model: torch.nn.Module) -> tuple[float, float]:
    """``(FLOPs per input position, FLOPs per attended pair)`` of ``model``'s forward: twice
    its non-embedding weights, and ``4 x hidden x layers`` (scores and weighted values);
    ``(1, 0)`` (positions only) for a model without a transformers config."""
    cfg = getattr(model, "config", None)
    hidden, layers = getattr(cfg, "hidden_size", None), getattr(cfg, "num_hidden_layers", None)
    if not (hidden and layers):
        return 1.0, 0.0
    embed = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings())
             if m is not None for p in m.parameters()}  # fmt: skip
    weights = sum(p.numel() for p in model.parameters() if id(p) not in embed)
    return 2.0 * weights, 4.0 * hidden * layers


def fused_head(model: torch.nn.Module) -> tuple[torch.nn.Module, Tensor] | None:
    """``(decoder, lm_head weight)`` when the model's logits are exactly
    ``decoder(...).last_hidden_state @ W^T`` (no head bias, soft-capping or logit scaling),
    so the fused log-prob kernel applies; else ``None``."""
    get_dec = getattr(model, "get_decoder", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    cfg = getattr(model, "config", None)
    if get_dec is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return None
    try:
        decoder = get_dec()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head.weight) if decoder is not None else None


def completion_logprobs(
    model: torch.nn.Module,
    sb: SeqBatch,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    impl: str = "auto",
    dists: int | Tensor | None = None,
    student_ids: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """log pi(y_t | x, y_<t) and the entropy of pi(. | x, y_<t) for every completion
    position, ``[B, L]`` float32, at the sampling temperature.

    ``student_ids`` ``[B, L, K]``: also return, last and *differentiable*, the log-probs of
    those ids (a teacher's top-K, or the vocabulary, for on-policy distillation), computed
    in row chunks under activation checkpointing (only the ``[B, L, K]`` result is kept);
    the result is then ``(logp, entropy, dists or None, student log-probs)``.

    ``dists``: also return ``(ids, logp)`` ``[B, L, K]`` (detached) of a per-token
    distribution: with an int ``K`` the policy's top-K ids and their log-probs, with a
    ``[B, L, K]`` id tensor the log-probs of those ids (the other policy's top-K), computed
    in row chunks from the full log-softmax (for ``TokenDistributions``).

    ``impl="fused"`` runs the decoder and feeds its last hidden states and the LM-head
    weight to :func:`rlpost.kernels.ops.linear_logprob.linear_logprob_entropy` (Triton on
    CUDA, a vocabulary-chunked torch path elsewhere): no ``[B, L, V]`` logits exist.
    ``impl="logits"`` takes the model's logits and computes both chunked over the rows
    (:func:`rlpost.core.logprobs.logprobs_and_entropy`). ``"auto"``: fused when
    :func:`fused_head` accepts the model.
    """
    if impl not in ("auto", "fused", "logits"):
        raise ValueError(f"impl must be auto, fused or logits, got {impl!r}")
    dev = next(model.parameters()).device
    head = fused_head(model) if impl != "logits" else None
    if impl == "fused" and head is None:
        raise ValueError(f"{type(model).__name__}: no plain linear LM head for the fused path")
    targets = sb.targets.to(dev)
    run = _packed_logprobs if sb.packed is not None else _padded_logprobs
    return run(model, sb, head, targets, temperature, chunk_size, dists, student_ids)


def _padded_logprobs(
    model,
    sb: SeqBatch,
    head,
    targets: Tensor,
    temperature: float,
    chunk: int,
    dists=None,
    student_ids=None,
):
    """The padded forward: one row per sequence under ``sb``'s attention, or under
    ``sb.shadow`` (a compressed KV cache's dense mask) when it has one. When every row
    attends to one contiguous run of positions (a left-padded prompt, its completion, right
    padding: :func:`contiguous_rows`), each row is shifted to start at its first real token
    and the forward runs without a mask: plain causal attention (no ``[B, 1, S, S]`` mask
    built, or kept for the backward; the attention skips the blocks above the diagonal and
    takes the grouped-query fast path), the same outputs at every real position."""
    L = targets.shape[1]
    dev = targets.device
    offsets = contiguous_rows(sb.attention_mask) if sb.shadow is None else None
    if offsets is not None and int(offsets.max()) < sb.P:  # (an empty prompt: the mask)
        return _causal_logprobs(model, sb, offsets, head, targets, temperature, chunk,
                                dists, student_ids)  # fmt: skip
    inputs = {
        "input_ids": sb.input_ids.to(dev),
        "attention_mask": sb.attention_mask.to(dev),
        "position_ids": sb.position_ids.to(dev),
        "use_cache": False,
    }
    if sb.shadow is not None:  # boolean for SDPA, additive for eager implementations
        allow = sb.shadow.to(dev)
        if getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa":
            inputs["attention_mask"] = allow
        else:
            dtype = next(model.parameters()).dtype
            zero = torch.zeros((), dtype=dtype, device=dev)
            inputs["attention_mask"] = torch.where(allow, zero, torch.finfo(dtype).min)

    def select_hidden(x: Tensor) -> Tensor:  # position P-1+t predicts completion token t
        return x[:, sb.P - 1 : sb.P - 1 + L]

    def select_logits(x: Tensor) -> Tensor:  # the model kept the last L + 1 positions
        return x[:, :-1]

    return _head_logprobs(
        model,
        inputs,
        head,
        (select_hidden, select_logits),
        targets,
        temperature,
        chunk,
        {"logits_to_keep": L + 1},
        dists=dists,
        student_ids=student_ids,
    )


def contiguous_rows(attention_mask: Tensor) -> Tensor | None:
    """``[B]`` each row's count of leading unattended positions when every row attends to
    one contiguous, non-empty run of positions (``0...0 1...1 0...0``); else ``None``."""
    am = attention_mask.bool()
    S = am.shape[1]
    idx = torch.arange(S, device=am.device)
    first = torch.where(am, idx, S).amin(1)
    last = torch.where(am, idx, -1).amax(1)
    if not bool(((last - first + 1) == am.sum(1)).all()) or bool((first == S).any()):
        return None
    return first


def _causal_logprobs(
    model, sb: SeqBatch, offsets: Tensor, head, targets: Tensor, temperature: float,
    chunk: int, dists=None, student_ids=None,
):  # fmt: skip
    """:func:`_padded_logprobs` over rows shifted left by ``offsets`` (the left padding
    moves to the end) under plain causal attention: a real token at position ``j`` of its
    row sees the same tokens at the same position ids as under the mask. Completion token
    ``t`` of row ``i`` is predicted at ``P - 1 - offsets[i] + t``."""
    B, L = targets.shape
    S, dev = sb.input_ids.shape[1], targets.device
    cols = torch.arange(S)
    ids = sb.input_ids.gather(1, (cols + offsets[:, None]) % S)
    first = sb.P - 1 - offsets  # [B] where each row's predictions start
    take = first[:, None] + torch.arange(L)  # [B, L]
    keep = S - int(first.min())  # the logits path keeps positions first.min() .. S - 1
    inputs = {
        "input_ids": ids.to(dev),
        "position_ids": cols.expand(B, S).to(dev),
        "use_cache": False,
    }
    rows = torch.arange(B, device=dev)[:, None]
    at_hidden, at_logits = take.to(dev), (take - (S - keep)).to(dev)
    return _head_logprobs(
        model,
        inputs,
        head,
        (lambda x: x[rows, at_hidden], lambda x: x[rows, at_logits]),
        targets,
        temperature,
        chunk,
        {"logits_to_keep": keep},
        dists=dists,
        student_ids=student_ids,
    )


def _head_logprobs(
    model,
    inputs: dict,
    head,
    selects,
    targets: Tensor,
    temperature: float,
    chunk: int,
    logits_kwargs: dict | None = None,
    mode=None,
    dists: int | Tensor | None = None,
    student_ids: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """One forward (inside ``mode``, a context manager), then log-probs / entropies
    ``[B, L]`` of ``targets``: through the fused kernel op from the decoder's hidden states
    when ``head`` (see :func:`fused_head`), else from the logits (called with
    ``logits_kwargs``). ``selects = (for hidden states, for logits)`` pick the predicting
    positions ``-> [B, L, ...]``."""
    B, L = targets.shape
    with mode or contextlib.nullcontext():
        if head is not None:
            decoder, weight = head
            hidden = decoder(**inputs).last_hidden_state
        else:
            logits = model(**inputs, **(logits_kwargs or {})).logits
    if head is not None:
        from rlpost.kernels.ops.linear_logprob import linear_logprob_entropy

        flat = selects[0](hidden).reshape(B * L, -1)
        logp, ent = linear_logprob_entropy(flat, weight, targets.reshape(-1), temperature)
        out = (logp.view(B, L), ent.view(B, L))

        def chunk_logits(s: slice) -> Tensor:
            return flat[s].detach() @ weight.detach().T

        extra = (
            _dist_logprobs(chunk_logits, B, L, dists, temperature, chunk)
            if dists is not None
            else None
        )
        if student_ids is None:
            return out if extra is None else (*out, extra)
        grad_lp = _ids_logprobs(lambda x: x @ weight.T, flat, student_ids, temperature, chunk)
        return (*out, extra, grad_lp)
    sel = selects[1](logits)
    res = logprobs_and_entropy(sel, targets, chunk_size=chunk, temperature=temperature)
    extra = None
    if dists is not None:
        flat_logits = sel.detach().reshape(B * L, -1)
        extra = _dist_logprobs(lambda s: flat_logits[s], B, L, dists, temperature, chunk)
    if student_ids is None:
        return (res.logp, res.entropy) if extra is None else (res.logp, res.entropy, extra)
    flat = sel.reshape(B * L, -1)
    grad_lp = _ids_logprobs(lambda x: x, flat, student_ids, temperature, chunk)
    return res.logp, res.entropy, extra, grad_lp


def _ids_logprobs(to_logits, flat: Tensor, ids: Tensor, temperature: float, chunk: int) -> Tensor:
    """Differentiable ``log_softmax(to_logits(flat) / temperature)`` at ``ids``
    ``[B, L, K]``, in row chunks under activation checkpointing: the ``[chunk, V]``
    log-softmax is recomputed in the backward instead of kept."""
    from torch.utils.checkpoint import checkpoint

    B, L, K = ids.shape
    flat_ids = ids.reshape(B * L, K).to(flat.device)

    def piece(x: Tensor, i: Tensor) -> Tensor:
        return (to_logits(x).float() / temperature).log_softmax(-1).gather(-1, i)

    parts = [
        checkpoint(piece, flat[s : s + chunk], flat_ids[s : s + chunk], use_reentrant=False)
        for s in range(0, B * L, chunk)
    ]
    return torch.cat(parts).view(B, L, K)


def _dist_logprobs(
    chunk_logits, B: int, L: int, dists: int | Tensor, temperature: float, chunk: int
) -> tuple[Tensor, Tensor]:
    """``(ids, logp)`` ``[B, L, K]``: the top-K (``dists`` an int) or the given ids' log-probs
    under ``log_softmax(logits / temperature)``, from row chunks of ``[N, V]`` logits."""
    ids_in = None if isinstance(dists, int) else dists.reshape(B * L, -1)
    out_ids, out_lp = [], []
    with torch.no_grad():
        for s in range(0, B * L, chunk):
            sl = slice(s, s + chunk)
            lsm = (chunk_logits(sl).float() / temperature).log_softmax(-1)
            if ids_in is None:
                k = min(int(dists), lsm.shape[-1])
                vals, ids = lsm.topk(k, dim=-1)
            else:
                ids = ids_in[sl].to(lsm.device)
                vals = lsm.gather(-1, ids)
            out_ids.append(ids)
            out_lp.append(vals)
    K = out_ids[0].shape[-1] if out_ids else 0
    return torch.cat(out_ids).view(B, L, K), torch.cat(out_lp).view(B, L, K)


def _packed_logprobs(
    model,
    sb: SeqBatch,
    head,
    targets: Tensor,
    temperature: float,
    chunk: int,
    dists=None,
    student_ids=None,
):
    """Shared-prompt packed forward: one sequence per prompt, gathered outputs.

    In a transformers model the uniform layout attends through the shared-prompt attention
    function, and the ragged one takes its rows' real tokens end to end (no padding in any
    per-token layer) and attends row by row under the rows' mask. Other models take the
    padded rows and a dense 4D mask (boolean for SDPA, additive for eager attention)."""
    inputs, idx, mode = _packed_inputs(model, sb.packed, targets.device)

    def select(x: Tensor) -> Tensor:
        return x.reshape(-1, x.shape[-1])[idx]

    return _head_logprobs(
        model,
        inputs,
        head,
        (select, select),
        targets,
        temperature,
        chunk,
        mode=mode,
        dists=dists,
        student_ids=student_ids,
    )


def _packed_inputs(model, pk, dev) -> tuple[dict[str, Any], Tensor, Any]:
    """The packed forward's ``(model inputs, [B, L] flat positions of the completion
    tokens' predictions, attention mode or None)`` for the packed batch ``pk`` (see
    :func:`_packed_logprobs`)."""
    from rlpost.llm.model.packing import (
        flat_rows,
        packed_rows_attention_mode,
        shared_prompt_attention_mode,
        supports_shared_attention,
    )

    inputs = {
        "input_ids": pk.input_ids.to(dev),
        "position_ids": pk.position_ids.to(dev),
        "use_cache": False,
    }
    idx = pk.gather.to(dev)  # [B, L] flat positions of the packed rows
    mode = None
    if pk.layout is not None and supports_shared_attention(model):
        mode = shared_prompt_attention_mode(model, pk.layout)
    elif supports_shared_attention(model):
        seqs = pk.seqs if pk.sequences else None
        rows = flat_rows(pk.tokens, pk.input_ids.shape[1], pk.allow, seqs).to(dev)
        inputs["input_ids"] = inputs["input_ids"].view(1, -1)[:, rows.keep]
        inputs["position_ids"] = inputs["position_ids"].view(1, -1)[:, rows.keep]
        idx = rows.src[idx]  # into the flat sequence
        mode = packed_rows_attention_mode(model, rows)
    elif pk.allow is None:
        raise ValueError(
            f"{type(model).__name__} cannot attend by sequence (no AttentionInterface): "
            "build its batch with make_seq_batch(..., sequences=False)"
        )
    elif getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa":
        inputs["attention_mask"] = pk.allow[:, None].to(dev)
    else:
        dtype = next(model.parameters()).dtype
        inputs["attention_mask"] = pk.additive_mask(dtype).to(dev)
    return inputs, idx, mode


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the duration, then back to its own mode."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def sampled_index(ids: Tensor, tokens: Tensor) -> Tensor:
    """Column of each sampled token among ``ids`` ``[N, L, K]`` (-1 when absent), long."""
    hit = ids == tokens[..., None]
    return torch.where(hit.any(-1), hit.long().argmax(-1), torch.full_like(tokens, -1)).long()


# ------------------------------------------------- the compressed-KV sampler's attention


def kept(q_pos: Tensor, k_pos: Tensor, sink: int, window: int) -> Tensor:
    """Whether a query at position ``q_pos`` still sees the key at ``k_pos`` (broadcast):
    one of the row's first ``sink`` tokens, or one of its last ``window`` (itself
    included), and not in its future."""
    return (k_pos <= q_pos) & ((k_pos < sink) | (q_pos - k_pos < window))


def shadow_mask(attention: Tensor, prompt_width: int, sink: int, window: int) -> Tensor:
    """``[B, 1, S, S]`` boolean: what each position of a padded ``[prompt; completion]``
    layout (``attention`` ``[B, S]``, prompts left-padded to ``prompt_width``) attended to
    when the sampler generated it: dense causal attention over the prompt (the prefill),
    the compressed cache for every completion token."""
    real = attention.bool()
    pos = (attention.long().cumsum(-1) - 1).clamp_min(0)
    q, k = pos[:, :, None], pos[:, None, :]
    causal = k <= q
    compressed = kept(q, k, sink, window)
    S = attention.shape[1]
    decode = (torch.arange(S) >= prompt_width)[None, :, None]
    allow = torch.where(decode, compressed, causal) & real[:, None, :]
    eye = torch.eye(S, dtype=torch.bool)[None]  # (a padding row attends to itself: no NaN)
    return (allow | (eye & ~real[:, :, None]))[:, None]
