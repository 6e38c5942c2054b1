"""Lossless speculative decoding for rollouts (001-27) with a draft model.

Each round a cheap draft proposes ``k`` tokens one at a time (its distributions ``q``);
the target scores all of them in one forward (its distributions ``p``, after the same
temperature / top-k / top-p processing). Position ``j``'s draft token ``d`` is accepted
with probability ``min(1, p(d) / q(d))``; at the first rejection the token is drawn from
the residual ``max(0, p - q)`` renormalised, and when all ``k`` pass a bonus token comes
from ``p`` at ``k + 1``: every emitted token is an exact draw from the target given its
prefix (the modified rejection sampling of speculative decoding). Greedy decoding accepts
while the draft equals the target's argmax, so its output is the target's greedy output.

Rows advance independently: a round emits, for every unfinished row, its accepted drafts
and one more token (its residual draw, or the bonus when all ``k`` pass). A row's rejected
drafts stay in both caches, which so stay rectangular, but leave its attention mask (and
so its positions) from then on. The log-probs returned are the target's, of the processed
distribution, as every engine returns them.

:func:`early_exit_draft` builds a self-speculative draft that shares the target's
embedding, first layers, final norm and head (no copy, so it follows every weight update).
``stats`` counts proposed and accepted drafts, target forwards (rounds), and the rounds
and tokens of unfinished rows (tokens per round per row: what one target forward yields).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from rlpost.llm.rollout.engines.base import FinishReason, SamplingParams
from rlpost.llm.rollout.engines.hf import HFEngine
from rlpost.llm.rollout.engines.lean import process_logits


def early_exit_draft(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """The target's first ``layers`` decoder layers, then its final norm and head, as a
    causal LM whose modules *are* the target's (self-speculative decoding)."""
    dec = model.get_decoder()
    n = len(dec.layers)
    if not 1 <= layers < n:
        raise ValueError(f"early-exit draft: layers must be in 1..{n - 1}, got {layers}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:layers]
    with torch.device("meta"):
        draft = type(model)(cfg)
    ddec = draft.get_decoder()
    for name, child in dec.named_children():
        setattr(ddec, name, torch.nn.ModuleList(dec.layers[:layers]) if name == "layers" else child)
    draft.set_output_embeddings(model.get_output_embeddings())
    meta = [k for k, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if meta:
        raise ValueError(f"early-exit draft: {meta[0]} is not shared with the target")
    return draft.eval()


def _cache_kwarg(model: torch.nn.Module) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older, and other models)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Rounds:
    """One chunk's state across rounds: the rows' tokens and attention mask (left-padded
    prompts, then the emitted tokens and drafts), both models' caches, the outputs so far."""

    def __init__(
        self,
        prompts: list[list[int]],
        n: int,
        sp: SamplingParams,
        k: int,
        pad_id: int,
        eos_ids,
        dev,
    ):
        from transformers import DynamicCache

        self.rows = rows = [p for p in prompts for _ in range(n)]
        N, P, L = len(rows), max(len(p) for p in prompts), sp.max_new_tokens
        self.N, self.P, self.L, self.sp, self.dev = N, P, L, sp, dev
        C_max = P + (L + 1) * (k + 1)
        self.seq = torch.full((N, C_max), pad_id, dtype=torch.long, device=dev)
        self.valid = torch.zeros(N, C_max, dtype=torch.long, device=dev)  # the attention mask
        for i, p in enumerate(rows):  # left padding
            self.seq[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
            self.valid[i, P - len(p) : P] = 1
        self.out_tok = torch.full((N, L + k + 1), pad_id, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(N, L + k + 1, device=dev)
        self.out_len = torch.zeros(N, dtype=torch.long, device=dev)
        self.done = torch.zeros(N, dtype=torch.bool, device=dev)
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=dev)
        self.greedy = sp.temperature == 0
        self.caches = {"t": DynamicCache(), "d": DynamicCache()}
        self.filled = {"t": 0, "d": 0}
        self.ar = torch.arange(N, device=dev)
        self.C = P  # the column of the last emitted token (fed at the next round)
        self.pend: Tensor | None = None  # the last emitted token

    def forward(self, which: str, model, end: int) -> Tensor:
        """Feed columns ``[filled, end)``; processed float32 logits of each of them."""
        start = self.filled[which]
        pos = (self.valid[:, :end].cumsum(-1) - 1).clamp_min(0)[:, start:end]
        out = model(
            input_ids=self.seq[:, start:end],
            attention_mask=self.valid[:, :end],
            position_ids=pos,
            use_cache=True,
            **{_cache_kwarg(model): self.caches[which]},
        )
        self.filled[which] = end
        logits = out.logits.float()
        if not bool(torch.isfinite(logits[~self.done]).all()):
            from rlpost.core.guard import NonFiniteError

            raise NonFiniteError(
                "the policy's logits are not finite at generation: its weights have diverged"
            )
        return process_logits(logits.flatten(0, 1), self.sp).view(*logits.shape)

    def draw(self, scores: Tensor) -> Tensor:
        """A token per row from processed ``scores``: the argmax when greedy, else a draw."""
        if self.greedy:
            return scores.argmax(-1)
        race = scores.softmax(-1) / torch.empty_like(scores).exponential_()
        return race.argmax(-1)  # an exact categorical draw (see lean.sample)

    def emit(self, j: int, tok: Tensor, scores: Tensor, where: Tensor) -> None:
        """Row-wise output ``j`` of this round (``where`` the rows emitting it)."""
        at = (self.out_len + j).clamp_max(self.out_tok.shape[1] - 1)
        lp = scores.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
        self.out_tok[self.ar[where], at[where]] = tok[where]
        self.out_lp[self.ar[where], at[where]] = lp[where]


class SpeculativeEngine(HFEngine):
    """Speculative sampling with ``draft`` (a causal LM on the target's tokenizer, or an
    int: an :func:`early_exit_draft` of that many layers; None: drafts only from
    :meth:`generate_with_drafts`, plain ``generate`` otherwise) proposing ``k`` tokens a
    round. ``own_copy`` /
    ``batch_size`` as for :class:`HFEngine`."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        draft: torch.nn.Module | int | None,
        k: int = 4,
        own_copy: bool = False,
        batch_size: int = 256,
    ):
        if k < 1:
            raise ValueError(f"speculative decoding: k must be >= 1, got {k}")
        super().__init__(model, tokenizer, own_copy, batch_size)
        self.draft = early_exit_draft(self.model, draft) if isinstance(draft, int) else draft
        self._fixed: list[list[int]] | None = None  # generate_with_drafts' rows
        if self.draft is not None and self.draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError("speculative decoding: the draft and target vocabularies differ")
        self.k = k
        # drafts proposed / accepted, target forwards, and per unfinished row: rounds, tokens
        self.stats = {"proposed": 0, "accepted": 0, "rounds": 0, "row_rounds": 0, "tokens": 0}

    def generate_with_drafts(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, drafts: list[list[int]]
    ):
        """:meth:`generate`, verifying the given ``drafts`` (one token list per row, rows
        ``n`` per prompt in order) instead of a draft model's: deterministic proposals, so
        token ``d`` is accepted with probability ``p(d)`` and a rejection draws from ``p``
        without ``d``; the output keeps the target's distribution whatever the drafts are
        (BubbleSpec, 001-05: the drafts are rollouts pre-generated in idle time)."""
        if len(drafts) != len(prompts) * n:
            raise ValueError(f"{len(drafts)} drafts for {len(prompts) * n} rows")
        self._fixed = [list(d) for d in drafts]
        try:
            return self.generate(prompts, n, sampling)
        finally:
            self._fixed = None

    @property
    def acceptance(self) -> float:
        """Accepted / proposed draft tokens so far."""
        return self.stats["accepted"] / max(self.stats["proposed"], 1)

    def _generate_chunk(self, prompts: list[list[int]], n: int, sp: SamplingParams):
        """``n`` completions of each prompt in speculative rounds (plain ``generate`` when
        nothing proposes drafts)."""
        target, draft = self.model, self.draft
        if draft is None and self._fixed is None:  # nothing to propose: plain generate
            return super()._generate_chunk(prompts, n, sp)
        fixed = None
        if self._fixed is not None:  # generate_with_drafts: this chunk's rows' drafts
            fixed = self._take_drafts(len(prompts) * n, sp.max_new_tokens)
        modes = [(m, m.training) for m in (target, draft) if m is not None]
        for m, _ in modes:
            m.eval()
        dev = next(target.parameters()).device
        st = _Rounds(prompts, n, sp, self.k, self.pad_id, self.eos_ids, dev)
        with torch.inference_mode():
            self._first_token(st)
            while not bool(st.done.all()):
                self._round(st, fixed)
        for m, was in modes:
            m.train(was)
        return self._rows(st)

    def _take_drafts(self, rows: int, L: int) -> Tensor:
        """The next ``rows`` rows' given drafts (taken off :meth:`generate_with_drafts`'
        list), cut or padded to ``L + k + 1`` tokens, on the target's device."""
        rows_d = self._fixed[:rows]
        self._fixed = self._fixed[rows:]
        width = L + self.k + 1
        fixed = torch.full((len(rows_d), width), self.pad_id, dtype=torch.long)
        for i, d in enumerate(rows_d):
            fixed[i, : min(len(d), width)] = torch.tensor(d[:width], dtype=torch.long)
        return fixed.to(next(self.model.parameters()).device)

    def _first_token(self, st: _Rounds) -> None:
        """Prefill the target on the prompts and emit every row's first token, from ``p``."""
        first = st.forward("t", self.model, st.P)[:, -1]
        st.pend = st.draw(first)
        st.emit(0, st.pend, first, ~st.done)
        st.out_len += 1
        st.done |= torch.isin(st.pend, st.eos) | (st.out_len >= st.L)

    def _round(self, st: _Rounds, fixed: Tensor | None) -> None:
        """One round: the last emitted token and ``k`` proposals fed, one target forward
        scores them, each row's accepted drafts and next token emitted."""
        k, C = self.k, st.C
        st.seq[:, C], st.valid[:, C] = st.pend, 1  # the last emitted token, then k drafts
        qs = self._propose(st, fixed)
        prop = st.seq[:, C + 1 : C + 1 + k]
        ps = st.forward("t", self.model, C + 1 + k)  # k + 1 outputs: predict C+1 .. C+k+1
        n_acc, nxt = self._accept(st, prop, qs, ps)
        self._advance(st, prop, ps, n_acc, nxt)
        st.pend = nxt
        st.C += k + 1

    def _propose(self, st: _Rounds, fixed: Tensor | None) -> list[Tensor]:
        """Write the round's ``k`` drafts after column ``st.C`` (the given ones, else the
        draft model's samples); their distributions ``q`` ``[N, V]`` (probabilities)."""
        k, C, seq, valid = self.k, st.C, st.seq, st.valid
        if fixed is not None:  # given drafts: deterministic proposals, q one-hot
            at = (st.out_len[:, None] + torch.arange(k, device=st.dev)[None]).clamp_max(
                fixed.shape[1] - 1
            )
            seq[:, C + 1 : C + 1 + k] = fixed.gather(1, at)
            valid[:, C + 1 : C + 1 + k] = 1
            V = self.model.config.vocab_size
            return [torch.nn.functional.one_hot(seq[:, C + 1 + j], V).float() for j in range(k)]
        qs = []
        for j in range(k):
            s = st.forward("d", self.draft, C + 1 + j)[:, -1]
            qs.append(s.softmax(-1))
            seq[:, C + 1 + j], valid[:, C + 1 + j] = st.draw(s), 1
        return qs

    def _accept(
        self, st: _Rounds, prop: Tensor, qs: list[Tensor], ps: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Each row's accepted drafts ``n_acc`` ``[N]`` (the rejected ones masked out) and
        the token after them: the residual draw at the first rejection, else the bonus."""
        k, C, ar = self.k, st.C, st.ar
        if st.greedy:
            ok = prop == ps[:, :k].argmax(-1)
        else:
            p_d = ps[:, :k].softmax(-1).gather(-1, prop[..., None]).squeeze(-1)
            q_d = torch.stack(qs, 1).gather(-1, prop[..., None]).squeeze(-1)
            ok = torch.rand(st.N, k, device=st.dev) * q_d < p_d  # u < p/q without dividing
        n_acc = ok.long().cumprod(1).sum(1)  # [N] each row's accepted drafts
        cols = torch.arange(k, device=st.dev)[None]
        st.valid[:, C + 1 : C + 1 + k] = (cols < n_acc[:, None]).long()  # rejected: unseen
        p_at = ps[ar, n_acc]  # [N, V] the target at each row's first unaccepted slot
        if st.greedy:
            nxt = p_at.argmax(-1)
        else:
            q_at = torch.stack([*qs, torch.zeros_like(qs[0])], 1)[ar, n_acc]
            resid = (p_at.softmax(-1) - q_at).clamp_min(0)  # (all k accepted: p)
            resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p_at.softmax(-1))
            nxt = st.draw(resid.log())
        return n_acc, nxt

    def _advance(self, st: _Rounds, prop: Tensor, ps: Tensor, n_acc: Tensor, nxt: Tensor) -> None:
        """Emit each unfinished row's accepted drafts and next token, count them in ``stats``,
        advance the output lengths and mark the rows that ended (EOS, length, stop string)."""
        k, L, sp = self.k, st.L, st.sp
        live = ~st.done
        for j in range(k + 1):  # the accepted drafts, then the new token
            tok = prop[:, j] if j < k else nxt
            if j < k:
                tok = torch.where(n_acc == j, nxt, tok)
            st.emit(j, tok, ps[:, j], live & (j <= n_acc))
        new = (n_acc + 1).clamp_max(L - st.out_len)
        self.stats["proposed"] += k * int(live.sum())
        self.stats["accepted"] += int(n_acc[live].sum())
        self.stats["rounds"] += 1
        self.stats["row_rounds"] += int(live.sum())
        self.stats["tokens"] += int(new[live].sum())
        offs = torch.arange(k + 1, device=st.dev)[None]
        fresh = st.out_tok[st.ar[:, None], st.out_len[:, None] + offs]  # this round's outputs
        hit = (torch.isin(fresh, st.eos) & (offs < new[:, None])).any(1)
        st.out_len = torch.where(live, st.out_len + new, st.out_len)
        st.done |= hit | (st.out_len >= L)
        if sp.stop and not bool(st.done.all()):
            stopped = self._stopped_rows(st.out_tok[:, : int(st.out_len.max())], sp.stop)
            st.done |= stopped.to(st.dev)

    def _rows(self, st: _Rounds) -> list[tuple[list[int], list[int], list[float], FinishReason]]:
        """The completions as ``(prompt, tokens, log-probs, finish reason)`` rows, cut at
        ``max_new_tokens``, the first EOS or stop string."""
        toks_all, lp_all = st.out_tok.cpu(), st.out_lp.cpu()
        out = []
        for i in range(st.N):
            ln = min(int(st.out_len[i]), st.L)
            toks, reason = self._truncate(toks_all[i, :ln].tolist(), st.sp)
            out.append((st.rows[i], toks, lp_all[i, : len(toks)].tolist(), reason))
        return out
