"""Lossless speculative decoding for rollouts (001-27) with a draft model.

Each round a cheap draft proposes ``k`` tokens one at a time (its distributions ``q``);
the target scores all of them in one forward (its distributions ``p``, after the same
temperature / top-k / top-p processing). Position ``j``'s draft token ``d`` is accepted
with probability ``min(1, p(d) / q(d))``; at the first rejection the token is drawn from
the residual ``max(0, p - q)`` renormalised, and when all ``k`` pass a bonus token comes
from ``p`` at ``k + 1``: every emitted token is an exact draw from the target given its
prefix (the modified rejection sampling of speculative decoding). Greedy decoding accepts
while the draft equals the target's argmax, so its output is the target's greedy output.

Rows advance together: a round keeps, for every row, its first ``m + 1`` tokens where
``m`` is the fewest drafts any unfinished row accepted (the ``m + 1``-th token is, per
row, its accepted draft, its residual draw or the bonus). Where to stop is decided by the
other rows' tests, never by a row's own later ones, so each row still emits exact draws;
the caches are cropped to the kept prefix (``DynamicCache.crop``) and stay rectangular.
The log-probs returned are the target's, of the processed distribution, as every engine
returns them.

:func:`early_exit_draft` builds a self-speculative draft that shares the target's
embedding, first layers, final norm and head (no copy, so it follows every weight update).
``stats`` counts proposed and accepted drafts, target forwards (rounds), and the rounds
and tokens of unfinished rows (tokens per round per row: what one target forward yields).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from rlpost.llm.rollout.engines.base import SamplingParams
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
        from transformers import DynamicCache

        target, draft, k = self.model, self.draft, self.k
        if draft is None and self._fixed is None:  # nothing to propose: plain generate
            return super()._generate_chunk(prompts, n, sp)
        fixed = None
        if self._fixed is not None:  # generate_with_drafts: this chunk's rows' drafts
            rows_d = self._fixed[: len(prompts) * n]
            self._fixed = self._fixed[len(prompts) * n :]
            width = sp.max_new_tokens + k + 1
            fixed = torch.full((len(rows_d), width), self.pad_id, dtype=torch.long)
            for i, d in enumerate(rows_d):
                fixed[i, : min(len(d), width)] = torch.tensor(d[:width], dtype=torch.long)
            fixed = fixed.to(next(target.parameters()).device)
        modes = [(m, m.training) for m in (target, draft) if m is not None]
        for m, _ in modes:
            m.eval()
        dev = next(target.parameters()).device
        rows = [p for p in prompts for _ in range(n)]
        N, P, L = len(rows), max(len(p) for p in prompts), sp.max_new_tokens
        C_max = P + (L + 1) * (k + 1)
        seq = torch.full((N, C_max), self.pad_id, dtype=torch.long, device=dev)
        valid = torch.zeros(N, C_max, dtype=torch.long, device=dev)  # the attention mask
        for i, p in enumerate(rows):  # left padding
            seq[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
            valid[i, P - len(p) : P] = 1
        out_tok = torch.full((N, L + k + 1), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros(N, L + k + 1, device=dev)
        out_len = torch.zeros(N, dtype=torch.long, device=dev)
        done = torch.zeros(N, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=dev)
        greedy = sp.temperature == 0
        caches = {"t": DynamicCache(), "d": DynamicCache()}
        filled = {"t": 0, "d": 0}
        ar = torch.arange(N, device=dev)

        def forward(which: str, model, end: int) -> Tensor:
            """Feed columns ``[filled, end)``; processed float32 logits of each of them."""
            start = filled[which]
            pos = (valid[:, :end].cumsum(-1) - 1).clamp_min(0)[:, start:end]
            out = model(
                input_ids=seq[:, start:end],
                attention_mask=valid[:, :end],
                position_ids=pos,
                use_cache=True,
                **{_cache_kwarg(model): caches[which]},
            )
            filled[which] = end
            logits = out.logits.float()
            if not bool(torch.isfinite(logits[~done]).all()):
                from rlpost.core.guard import NonFiniteError

                raise NonFiniteError(
                    "the policy's logits are not finite at generation: its weights have diverged"
                )
            return process_logits(logits.flatten(0, 1), sp).view(*logits.shape)

        def draw(scores: Tensor) -> Tensor:
            if greedy:
                return scores.argmax(-1)
            race = scores.softmax(-1) / torch.empty_like(scores).exponential_()
            return race.argmax(-1)  # an exact categorical draw (see lean.sample)

        def emit(j: int, tok: Tensor, scores: Tensor, where: Tensor) -> None:
            """Row-wise output ``j`` of this round (``where`` the rows emitting it)."""
            at = (out_len + j).clamp_max(out_tok.shape[1] - 1)
            lp = scores.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
            out_tok[ar[where], at[where]] = tok[where]
            out_lp[ar[where], at[where]] = lp[where]

        with torch.inference_mode():
            first = forward("t", target, P)[:, -1]  # the prompt; the first token from p
            pend = draw(first)
            emit(0, pend, first, ~done)
            out_len += 1
            done |= torch.isin(pend, eos) | (out_len >= L)
            C = P
            while not bool(done.all()):
                seq[:, C], valid[:, C] = pend, 1  # the last emitted token, then k drafts
                qs = []  # the proposals' distributions [N, V] (probabilities)
                if fixed is not None:  # given drafts: deterministic proposals, q one-hot
                    at = (out_len[:, None] + torch.arange(k, device=dev)[None]).clamp_max(
                        fixed.shape[1] - 1
                    )
                    seq[:, C + 1 : C + 1 + k] = fixed.gather(1, at)
                    valid[:, C + 1 : C + 1 + k] = 1
                    V = target.config.vocab_size
                    qs = [
                        torch.nn.functional.one_hot(seq[:, C + 1 + j], V).float() for j in range(k)
                    ]
                for j in range(k if fixed is None else 0):
                    s = forward("d", draft, C + 1 + j)[:, -1]
                    qs.append(s.softmax(-1))
                    seq[:, C + 1 + j], valid[:, C + 1 + j] = draw(s), 1
                prop = seq[:, C + 1 : C + 1 + k]
                ps = forward("t", target, C + 1 + k)  # k + 1 outputs: predict C+1 .. C+k+1
                if greedy:
                    ok = prop == ps[:, :k].argmax(-1)
                else:
                    p_d = ps[:, :k].softmax(-1).gather(-1, prop[..., None]).squeeze(-1)
                    q_d = torch.stack(qs, 1).gather(-1, prop[..., None]).squeeze(-1)
                    ok = torch.rand(N, k, device=dev) * q_d < p_d  # u < p/q without dividing
                n_acc = ok.long().cumprod(1).sum(1)  # [N] each row's accepted drafts
                cols = torch.arange(k, device=dev)[None]
                valid[:, C + 1 : C + 1 + k] = (cols < n_acc[:, None]).long()  # rejected: unseen
                p_at = ps[ar, n_acc]  # [N, V] the target at each row's first unaccepted slot
                if greedy:
                    nxt = p_at.argmax(-1)
                else:
                    q_at = torch.stack([*qs, torch.zeros_like(qs[0])], 1)[ar, n_acc]
                    resid = (p_at.softmax(-1) - q_at).clamp_min(0)  # (all k accepted: p)
                    resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p_at.softmax(-1))
                    nxt = draw(resid.log())
                live = ~done
                for j in range(k + 1):  # the accepted drafts, then the new token
                    tok = prop[:, j] if j < k else nxt
                    if j < k:
                        tok = torch.where(n_acc == j, nxt, tok)
                    emit(j, tok, ps[:, j], live & (j <= n_acc))
                new = (n_acc + 1).clamp_max(L - out_len)
                self.stats["proposed"] += k * int(live.sum())
                self.stats["accepted"] += int(n_acc[live].sum())
                self.stats["rounds"] += 1
                self.stats["row_rounds"] += int(live.sum())
                self.stats["tokens"] += int(new[live].sum())
                offs = torch.arange(k + 1, device=dev)[None]
                fresh = out_tok[ar[:, None], out_len[:, None] + offs]  # this round's outputs
                hit = (torch.isin(fresh, eos) & (offs < new[:, None])).any(1)
                out_len = torch.where(live, out_len + new, out_len)
                done |= hit | (out_len >= L)
                if sp.stop and not bool(done.all()):
                    done |= self._stopped_rows(out_tok[:, : int(out_len.max())], sp.stop).to(dev)
                pend = nxt
                C += k + 1
        for m, was in modes:
            m.train(was)
        toks_all, lp_all = out_tok.cpu(), out_lp.cpu()
        out = []
        for i in range(N):
            ln = min(int(out_len[i]), L)
            toks, reason = self._truncate(toks_all[i, :ln].tolist(), sp)
            out.append((rows[i], toks, lp_all[i, : len(toks)].tolist(), reason))
        return out
