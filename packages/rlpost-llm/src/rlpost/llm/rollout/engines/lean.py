"""A lean rollout engine: one prefill per prompt, a preallocated KV cache, a plain decode loop.

Hugging Face ``generate`` with ``num_return_sequences=n`` prefills every one of a group's
``n`` copies of a prompt, rebuilds attention masks and runs its logits processors and
stopping criteria on every token, and keeps decoding rows that have already finished.
On the tiny models of this repository that overhead is most of a GRPO step's rollout
(``docs/llm.md``, "Where a step's time goes"). :class:`LeanEngine` runs the model's own
modules (embeddings, rotary embedding, decoder layers, final norm, LM head; LoRA-wrapped
projections included) in a loop of its own:

* **prefill once per prompt**: the ``U`` distinct prompts of a call (left-padded) go through
  the decoder once; their keys and values are copied into the static cache of all
  ``N = U n`` rows, and the first token's distribution is shared by the group;
* **static cache**: per layer one ``[N, H_kv, T_prompt + max_new_tokens, d]`` buffer
  written in place; attention is one ``scaled_dot_product_attention`` over the filled
  prefix with a key mask (left padding), grouped-query heads folded into the query axis;
* **finished rows leave the batch**: when an eighth (``1 / COMPACT``) of the active rows
  have stopped (EOS or a stop string), the cache and state are compacted to the unfinished
  rows;
* **sampling** at temperature / top-k / top-p with the same order and semantics as
  ``generate``'s warpers, by the exponential-race form of the Gumbel-max trick (no host
  synchronisation, no error on a diverged row); the log-probability of each sampled token
  under the processed distribution is returned, as the HF engine does. Non-finite logits
  raise :class:`~rlpost.core.guard.NonFiniteError` at the end of the call.

The attention goes through transformers' ``AttentionInterface`` (a registered function that
reads and writes the engine's cache), so each architecture's own projections, q/k norms,
biases and rotary embedding are used unchanged. Architectures whose decoder forward does
anything beyond ``embed -> layers -> norm`` (embedding scaling, soft-capping, sliding
windows shorter than the sequence) are not accepted: :func:`lean_unsupported` says why, and
the trainer falls back to :class:`~rlpost.llm.rollout.engines.hf.HFEngine`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from rlpost.llm.rollout.engines.base import FinishReason, LocalEngine, SamplingParams

NAME = "rlpost_lean_decode"
# model types whose decoder forward is exactly embed -> rotary -> layers -> norm
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_STATE: contextvars.ContextVar[_Cache | None] = contextvars.ContextVar(
    "rlpost_lean_state", default=None
)
_registered = False
COMPACT = 8  # compact the batch once 1/COMPACT of its rows have finished
DECODE_MODES = ("auto", "dynamic", "static", "graph")
_GRAPH_NEEDS_CUDA = (
    "LeanEngine: decode='graph' (rollout.lean_decode) needs the model on a CUDA device"
)


@dataclass
class _Cache:
    """The decode state the registered attention function reads: per-layer key / value
    buffers, the key mask of the filled prefix, and the write position (``None``: prefill,
    whose keys / values are stored as they come)."""

    k: dict[int, Tensor] = field(default_factory=dict)
    v: dict[int, Tensor] = field(default_factory=dict)
    mask: Tensor | None = None  # prefill [B, 1, T, T]; decode [N, 1, 1, S]
    write: int | None = None


def _attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling,
               dropout: float = 0.0, **kwargs):  # fmt: skip
    """transformers attention function over the engine's cache: ``query [B, H, T, d]``
    -> ``([B, T, H, d], None)``."""
    st = _STATE.get()
    if st is None:
        raise RuntimeError(f"{NAME} attention used outside LeanEngine")
    i = module.layer_idx
    B, H, _, d = query.shape
    Hkv = key.shape[1]
    rep = H // Hkv
    if st.write is None:  # prefill: causal over the left-padded prompts
        st.k[i], st.v[i] = key, value
        k = key.repeat_interleave(rep, 1) if rep > 1 else key
        v = value.repeat_interleave(rep, 1) if rep > 1 else value
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=st.mask, scale=scaling)
        return out.transpose(1, 2), None
    kc, vc = st.k[i], st.v[i]
    kc[:, :, st.write] = key[:, :, 0]
    vc[:, :, st.write] = value[:, :, 0]
    q = query.reshape(B, Hkv, rep, d)  # one query token: the heads of a KV head as queries
    out = _decode_attention(q, kc, vc, _key_bias(st.mask, Hkv, q.dtype), scaling)
    return out.reshape(B, H, 1, d).transpose(1, 2), None


def _key_bias(mask: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """``[B * heads, 1, S]`` for :func:`_decode_attention`: 0 on the columns the key mask
    ``[B, 1, 1, S]`` allows, ``-inf`` on the others."""
    B, S = mask.shape[0], mask.shape[-1]
    bias = torch.zeros(B, heads, 1, S, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf")).view(B * heads, 1, S)


def _decode_attention(q: Tensor, kc: Tensor, vc: Tensor, bias: Tensor, scale: float) -> Tensor:
    """One query token's attention over the first ``S`` cached columns (``S``: the bias's
    last size): ``q [B, Hkv, rep, d]`` (the query heads of each key / value head), the
    caches ``[B, Hkv, T, d]``, ``bias`` from :func:`_key_bias` -> ``[B, Hkv, rep, d]``. The
    scale and the mask ride on the score product (``baddbmm``: no pass of their own over
    the scores); the softmax runs in float32."""
    B, Hkv, rep, d = q.shape
    S = bias.shape[-1]
    k, v = kc[:, :, :S].flatten(0, 1), vc[:, :, :S].flatten(0, 1)  # views: [B Hkv, S, d]
    s = torch.baddbmm(bias, q.reshape(B * Hkv, rep, d), k.transpose(1, 2), alpha=scale)
    return torch.bmm(s.float().softmax(-1).to(q.dtype), v).view(B, Hkv, rep, d)


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    _registered = True


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def lean_unsupported(model: torch.nn.Module) -> str | None:
    """Why :class:`LeanEngine` cannot run ``model`` (``None`` when it can)."""
    base = _base(model)
    cfg = getattr(base, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED:
        return f"model type {mtype!r} is not one of {', '.join(SUPPORTED)}"
    if not getattr(base, "_supports_attention_backend", False):
        return f"{type(base).__name__} does not route attention through AttentionInterface"
    dec = base.get_decoder()
    for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(dec, part):
            return f"{type(dec).__name__} has no {part}"
    head = base.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        return "the LM head is not a linear layer"
    sliding = any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or [])
    if (
        sliding
        and getattr(cfg, "use_sliding_window", True)
        and getattr(cfg, "sliding_window", None)
    ):
        return "sliding-window attention layers"
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return f"config.{attr} is set"
    return None


def process_logits(logits: Tensor, sp: SamplingParams) -> Tensor:
    """Float32 logits after ``generate``'s own warpers, in its order: temperature, top-k,
    top-p (masked entries at ``-inf``); greedy (temperature 0) leaves them raw."""
    x = logits.float()
    if sp.temperature == 0:
        return x
    for warp in _warpers(sp):
        x = warp(None, x)
    return x


@functools.lru_cache(maxsize=32)
def _warpers(sp: SamplingParams) -> tuple:
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out = [TemperatureLogitsWarper(sp.temperature)] if sp.temperature != 1.0 else []
    if sp.top_k:
        out.append(TopKLogitsWarper(sp.top_k))
    if sp.top_p < 1.0:
        out.append(TopPLogitsWarper(sp.top_p))
    return tuple(out)


def sample(scores: Tensor, greedy: bool) -> tuple[Tensor, Tensor]:
    """``(tokens [B], log-probs [B])`` from processed ``scores [B, V]``: argmax when greedy,
    else the exponential race ``argmax p_i / E_i`` (``E_i ~ Exp(1)``), an exact draw from
    ``softmax(scores)`` that needs no host synchronisation."""
    logp = scores.log_softmax(-1)
    if greedy:
        tok = scores.argmax(-1)
    else:
        race = logp.exp() / torch.empty_like(logp).exponential_()
        tok = race.argmax(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _cat_linear(mods: list[torch.nn.Module]) -> tuple[Tensor, Tensor | None]:
    """One weight (and bias) for several linear layers applied to the same input."""
    w = torch.cat([m.weight for m in mods])
    if all(m.bias is None for m in mods):
        return w, None
    return w, torch.cat(
        [m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in mods]
    )


class _FusedDecode:
    """The decode step of plain llama-family layers with fewer, larger ops: q/k/v and
    gate/up as one matrix product each (weights concatenated once per ``generate`` call),
    the rotary embedding of queries and keys in one pass, attention over the static cache;
    the norms and the down projection are the layer's own modules. :meth:`build` returns ``None`` when a
    layer is not plain (e.g. LoRA-wrapped projections): the module path then runs."""

    def __init__(self, layers: list[dict]):
        self.layers = layers

    @staticmethod
    def build(dec: torch.nn.Module) -> _FusedDecode | None:
        out = []
        for layer in dec.layers:
            a, mlp = layer.self_attn, layer.mlp
            projs = [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
            mlps = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
            if any(type(m) is not torch.nn.Linear for m in projs + mlps):
                return None
            if not hasattr(mlp, "act_fn"):
                return None
            wqkv, bqkv = _cat_linear(projs[:3])
            wgu, bgu = _cat_linear(mlps[:2])
            out.append(
                dict(
                    ln1=layer.input_layernorm,
                    ln2=layer.post_attention_layernorm,
                    wqkv=wqkv,
                    bqkv=bqkv,
                    o=a.o_proj,
                    q_norm=getattr(a, "q_norm", None),
                    k_norm=getattr(a, "k_norm", None),
                    split=(a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features),
                    hd=a.head_dim,
                    scale=a.scaling,
                    wgu=wgu,
                    bgu=bgu,
                    inter=mlps[0].out_features,
                    act=mlp.act_fn,
                    down=mlps[2],
                )
            )
        return _FusedDecode(out)

    def __call__(self, h: Tensor, cos: Tensor, sin: Tensor, st: _Cache) -> Tensor:
        """``h [B, 1, D]`` through every layer at cache position ``st.write`` (an int, or a
        one-element tensor on the device for a static step)."""
        B = h.shape[0]
        cos, sin = cos[:, None, None], sin[:, None, None]  # [B, 1, 1, d]: over the heads
        w, biases = st.write, {}  # the key bias per key / value head count, once a step
        for i, ly in enumerate(self.layers):
            hd = ly["hd"]
            qkv = F.linear(ly["ln1"](h), ly["wqkv"], ly["bqkv"])
            q, k, v = qkv.split(ly["split"], -1)
            q, k, v = q.view(B, 1, -1, hd), k.view(B, 1, -1, hd), v.view(B, 1, -1, hd)
            if ly["q_norm"] is not None:
                q, k = ly["q_norm"](q), ly["k_norm"](k)
            H, Hkv = q.shape[2], k.shape[2]
            qk = torch.cat([q, k], 2).transpose(1, 2)  # [B, H + Hkv, 1, d]
            half = hd // 2
            rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = (qk * cos) + (rot * sin)
            kc, vc = st.k[i], st.v[i]
            if isinstance(w, Tensor):  # a static step (_StaticDecode): the column on the device
                kc.index_copy_(2, w, qk[:, H:])
                vc.index_copy_(2, w, v.transpose(1, 2))
            else:
                kc[:, :, w] = qk[:, H:, 0]
                vc[:, :, w] = v[:, 0]
            if Hkv not in biases:
                biases[Hkv] = _key_bias(st.mask, Hkv, h.dtype)
            qh = qk[:, :H].reshape(B, Hkv, H // Hkv, hd)
            o = _decode_attention(qh, kc, vc, biases[Hkv], ly["scale"]).reshape(B, 1, H * hd)
            h = h + ly["o"](o)
            gu = F.linear(ly["ln2"](h), ly["wgu"], ly["bgu"])
            g, u = gu.split(ly["inter"], -1)
            h = h + ly["down"](ly["act"](g) * u)
        return h


class _StaticDecode:
    """The fused decode step at fixed shapes, so that a CUDA graph can replay it: every row
    stays in the batch (no compaction), attention always spans the whole static cache under
    its key mask (unwritten columns are masked), and the write column, the tokens and their
    positions live in device buffers that each step overwrites. ``graph``: capture the step
    once (after two warm-up runs on a side stream, which write what the first step writes)
    and replay it; without, the same step runs eagerly (how the CPU tests check it)."""

    def __init__(self, engine: LeanEngine, fused: _FusedDecode, st: _Cache, keys: Tensor,
                 graph: bool):  # fmt: skip
        N, dev = len(keys), keys.device
        self.engine, self.fused, self.st, self.graph = engine, fused, st, graph
        self.tok = torch.zeros(N, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(N, 1, dtype=torch.long, device=dev)
        st.write = torch.zeros(1, dtype=torch.long, device=dev)
        st.mask = keys[:, None, None, :]  # a view: the loop's in-place key updates show
        self.out: Tensor | None = None
        self.cuda_graph = None

    def _step(self) -> Tensor:
        return self.engine._forward(self.tok, self.pos, self.fused)

    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self._step()
        self.cuda_graph = graph

    def __call__(self, tok: Tensor, pos: Tensor, column: int) -> Tensor:
        """Float32 logits ``[N, V]`` of the step writing cache column ``column``."""
        self.tok.copy_(tok[:, None])
        self.pos.copy_(pos[:, None])
        self.st.write.fill_(column)
        if not self.graph:
            return self._step()
        if self.cuda_graph is None:
            try:
                self._capture()
            except RuntimeError as exc:  # e.g. an op that cannot be captured: run eagerly
                warnings.warn(f"rlpost: the decode step could not be captured as a CUDA "
                              f"graph ({str(exc)[:200]}); decoding without it", stacklevel=2)  # fmt: skip
                self.graph = False
                return self._step()
        self.cuda_graph.replay()
        return self.out  # (the graph's output buffer: the next call overwrites it)


def _left_padded(prompts: list[list[int]], pad_id: int, dev) -> tuple[Tensor, Tensor]:
    """``(ids [U, T], real [U, T] bool)`` of the prompts left-padded to the longest, on ``dev``."""
    U, Tp = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((U, Tp), pad_id, dtype=torch.long)
    real = torch.zeros(U, Tp, dtype=torch.bool)
    for i, p in enumerate(prompts):  # left padding
        ids[i, Tp - len(p) :] = torch.tensor(p, dtype=torch.long)
        real[i, Tp - len(p) :] = True
    return ids.to(dev), real.to(dev)


def _prefill_mask(real: Tensor) -> Tensor:
    """``[U, 1, T, T]`` causal attention over the real prompt tokens; pads see themselves."""
    Tp, dev = real.shape[1], real.device
    causal = torch.ones(Tp, Tp, dtype=torch.bool, device=dev).tril()
    eye = torch.eye(Tp, dtype=torch.bool, device=dev)
    return ((causal & real[:, None, :]) | eye)[:, None]


def _spread_cache(st: _Cache, real: Tensor, n: int, L: int) -> Tensor:
    """Replace the prefill's keys / values in ``st`` by the static cache of all ``N = U n``
    rows (``T + L`` columns, the prompt part filled); its key mask ``[N, T + L]``."""
    N, Tp = len(real) * n, real.shape[1]
    for i in list(st.k):
        for buf in (st.k, st.v):
            x = buf[i]
            full = x.new_zeros(N, x.shape[1], Tp + L, x.shape[3])
            full[:, :, :Tp] = x.repeat_interleave(n, 0)
            buf[i] = full
    keys = torch.zeros(N, Tp + L, dtype=torch.bool, device=real.device)
    keys[:, :Tp] = real.repeat_interleave(n, 0)
    return keys


def _compact(st: _Cache, done: Tensor, keys: Tensor, next_pos: Tensor, row: Tensor, tok: Tensor):
    """Drop the finished rows (``done``, on the CPU) from the cache and the decode state;
    ``(keys, next_pos, row, tok, done)`` of the unfinished rows."""
    keep = torch.nonzero(~done).flatten()
    kd = keep.to(keys.device)
    for i in list(st.k):
        st.k[i], st.v[i] = st.k[i][kd], st.v[i][kd]
    return keys[kd], next_pos[kd], row[kd], tok[kd], done[keep]


class LeanEngine(LocalEngine):
    """The lean decode loop (module docstring) behind the :class:`RolloutEngine` protocol.

    ``own_copy`` / ``batch_size`` as for :class:`~rlpost.llm.rollout.engines.hf.HFEngine`: the
    trainer's module used in place (colocated) or a deep copy updated by
    :meth:`update_weights`; at most ``batch_size`` completions decoded at once; ``fuse``:
    decode steps of plain layers through :class:`_FusedDecode` (else the modules).
    ``decode``: ``dynamic`` (finished rows leave the batch, attention over the filled
    prefix), ``graph`` (CUDA: the fused step at fixed shapes captured once per call as a
    CUDA graph and replayed, :class:`_StaticDecode`: on a launch-bound GPU, decoding the
    finished rows is expected to cost less than the launches the graph saves; not yet
    measured, docs/gpu.md), ``static`` (the same fixed-shape step run eagerly) or ``auto``
    (``graph`` on CUDA, else ``dynamic``). Layers that do not fuse decode dynamically.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        own_copy: bool = False,
        batch_size: int = 256,
        fuse: bool = True,
        decode: str = "auto",
    ):
        why = lean_unsupported(model)
        if why is not None:
            raise ValueError(f"LeanEngine: {why}; use the hf engine")
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        params = next(iter(model.parameters()), None)
        if decode == "graph" and (params is None or not params.is_cuda):
            raise ValueError(_GRAPH_NEEDS_CUDA)
        super().__init__(model, tokenizer, own_copy, batch_size)
        self.fuse, self.decode = fuse, decode
        _register()

    def _static(self, fused: _FusedDecode | None, st: _Cache, keys: Tensor):
        """The step of ``decode`` (see :class:`_StaticDecode`): ``None`` for the dynamic loop
        (``auto`` off CUDA, or layers that do not fuse)."""
        mode = self.decode
        if mode == "auto":
            mode = "graph" if keys.is_cuda else "dynamic"
        if mode == "dynamic" or fused is None:
            return None
        if mode == "graph" and not keys.is_cuda:  # (a model moved off CUDA after __init__)
            raise ValueError(_GRAPH_NEEDS_CUDA)
        return _StaticDecode(self, fused, st, keys, graph=mode == "graph")

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        with self._mode(), torch.inference_mode():  # the results leave as Python lists
            yield

    @contextlib.contextmanager
    def _mode(self) -> Iterator[None]:
        base = _base(self.model)
        was_training = self.model.training
        self.model.eval()
        before = base.config._attn_implementation
        base.config._attn_implementation = NAME
        try:
            yield
        finally:
            base.config._attn_implementation = before
            self.model.train(was_training)

    def _forward(self, ids: Tensor, pos: Tensor, fused: _FusedDecode | None = None) -> Tensor:
        """Decoder layers on ``ids [B, T]`` at positions ``pos`` (through ``fused`` for a
        decode step when given); float32 logits of the last position ``[B, V]``."""
        base = _base(self.model)
        dec = base.get_decoder()
        h = dec.embed_tokens(ids)
        cos_sin = dec.rotary_emb(h, pos)
        if fused is not None:
            h = fused(h, cos_sin[0][:, 0], cos_sin[1][:, 0], _STATE.get())
        else:
            for layer in dec.layers:
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
                h = h[0] if isinstance(h, tuple) else h
        return base.get_output_embeddings()(dec.norm(h[:, -1])).float()

    def _generate_chunk(self, prompts: list[list[int]], n: int, sp: SamplingParams):
        """``n`` completions of each prompt: one prefill per prompt (its cache spread over
        the prompt's ``n`` rows), then the decode loop."""
        dev = next(self.model.parameters()).device
        ids, real = _left_padded(prompts, self.pad_id, dev)
        pos = (real.long().cumsum(-1) - 1).clamp_min(0)
        st = _Cache(mask=_prefill_mask(real))
        token = _STATE.set(st)
        try:
            logits = self._forward(ids, pos).repeat_interleave(n, 0)  # [N, V] first tokens
            fused = _FusedDecode.build(_base(self.model).get_decoder()) if self.fuse else None
            keys = _spread_cache(st, real, n, sp.max_new_tokens)
            next_pos = real.sum(-1).repeat_interleave(n, 0)  # [N] position of token 0
            static = self._static(fused, st, keys)
            toks, lps, lengths, finite = self._decode(logits, keys, next_pos, st, fused, sp,
                                                      static)  # fmt: skip
        finally:
            _STATE.reset(token)
        if not bool(finite):
            from rlpost.core.guard import NonFiniteError

            raise NonFiniteError(
                "the policy's logits are not finite at generation: its weights have diverged"
            )
        return self._rows(prompts, n, toks, lps, lengths, sp)

    def _decode(
        self,
        logits: Tensor,
        keys: Tensor,
        next_pos: Tensor,
        st: _Cache,
        fused: _FusedDecode | None,
        sp: SamplingParams,
        static: _StaticDecode | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The token-by-token loop from the first tokens' ``logits`` over the static cache
        (``keys``: its filled columns, ``next_pos``: each row's first position); ``(tokens
        [N, L], log-probs [N, L], lengths [N] (CPU), whether all logits were finite)``.
        With ``static`` every row stays in the batch and the step is its fixed-shape one."""
        N, L = len(keys), sp.max_new_tokens
        Tp, dev = keys.shape[1] - L, keys.device
        row = torch.arange(N, device=dev)  # the batch row -> the completion it extends
        toks = torch.zeros(N, L, dtype=torch.long, device=dev)
        lps = torch.zeros(N, L, device=dev)
        lengths = torch.full((N,), L, dtype=torch.long)
        finite = torch.ones((), dtype=torch.bool, device=dev)
        done = torch.zeros(N, dtype=torch.bool)  # of the active rows
        eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=dev)
        greedy = sp.temperature == 0
        for t in range(L):
            finite &= torch.isfinite(logits).all()
            if t < sp.min_new_tokens:  # generate's order: processors, then the warpers
                logits = logits.index_fill(-1, eos, float("-inf"))
            tok, lp = sample(process_logits(logits, sp), greedy)
            toks[row, t], lps[row, t] = tok, lp
            stop = self._stop_at(tok, eos, toks, row, t, sp)
            newly = stop & ~done
            lengths[row.cpu()[newly]] = t + 1
            done |= stop
            if bool(done.all()) or t == L - 1:
                break
            if static is None and int(done.sum()) * COMPACT >= len(row):  # compact
                keys, next_pos, row, tok, done = _compact(st, done, keys, next_pos, row, tok)
            keys[:, Tp + t] = True
            if static is not None:  # (its st.mask views the whole of keys)
                logits = static(tok, next_pos + t, Tp + t)
                continue
            st.write, st.mask = Tp + t, keys[:, None, None, : Tp + t + 1]
            logits = self._forward(tok[:, None], (next_pos + t)[:, None], fused)
        return toks, lps, lengths, finite

    def _stop_at(
        self, tok: Tensor, eos: Tensor, toks: Tensor, row: Tensor, t: int, sp: SamplingParams
    ) -> Tensor:
        """``[B]`` bool (CPU): the active rows that stop at token ``t`` (EOS or a stop string)."""
        stop = torch.isin(tok, eos).cpu()
        if sp.stop:
            stop |= self._stopped(toks[row, : t + 1], sp.stop)
        return stop

    def _rows(
        self,
        prompts: list[list[int]],
        n: int,
        toks: Tensor,
        lps: Tensor,
        lengths: Tensor,
        sp: SamplingParams,
    ) -> list[tuple[list[int], list[int], list[float], FinishReason]]:
        """The completions as ``(prompt, tokens, log-probs, finish reason)`` rows."""
        toks, lps = toks.cpu(), lps.cpu()
        out = []
        for i in range(len(lengths)):
            k = int(lengths[i])
            reason: FinishReason = "length"
            if k < sp.max_new_tokens or self._ends(toks[i, :k].tolist(), sp):
                reason = "stop"
            out.append((prompts[i // n], toks[i, :k].tolist(), lps[i, :k].tolist(), reason))
        return out

    def _stopped(self, toks: Tensor, stops: tuple[str, ...]) -> Tensor:
        """``[B]`` bool: the row's text so far holds a stop string."""
        texts = self.tokenizer.batch_decode(toks.tolist(), skip_special_tokens=False)
        return torch.tensor([any(s in t for s in stops) for t in texts], dtype=torch.bool)

    def _ends(self, toks: list[int], sp: SamplingParams) -> bool:
        """The completion ends with EOS or a stop string (it stopped at its last token)."""
        if toks and toks[-1] in self.eos_ids:
            return True
        if sp.stop:
            text = self.tokenizer.decode(toks, skip_special_tokens=False)
            return any(s in text for s in sp.stop)
        return False
