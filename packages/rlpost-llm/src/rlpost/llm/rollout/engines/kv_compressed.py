"""Rollouts under a compressed KV cache (001-13), and the learner's shadow of it.

The sampler keeps, for every generated token's attention, only the first ``sink`` tokens
of the row and the last ``window`` ones (attention sinks plus a recent window, as
StreamingLLM); the prompt's prefill attends densely, as compression starts after it. Cache
columns that no row will ever attend again are dropped from the ``DynamicCache`` as
decoding goes on, so the cache holds at most ``P + sink + window`` columns (left padding
included); entries kept for some rows only are masked per row. Keys keep their absolute
positions (RoPE applied once, at insertion), so the sampled distribution is exactly the
one a full forward computes with :func:`~rlpost.llm.model.policy.shadow_mask`: the learner can score the sampler's
own policy, differentiably, which is what the bias correction of
:mod:`rlpost.llm.trainer` (``rollout.kv_compression``) trains on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.llm.model.policy import kept, shadow_mask
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.engines.hf import HFEngine
from rlpost.llm.rollout.engines.lean import process_logits, sample
from rlpost.llm.rollout.engines.speculative import _cache_kwarg

__all__ = ["KVCompressedEngine", "kept", "shadow_mask"]


def _left_padded(rows: list[list[int]], P: int, pad_id: int, dev) -> tuple[Tensor, Tensor]:
    """``(ids, valid)`` ``[N, P]`` (long) of the rows left-padded to ``P``, on ``dev``."""
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    valid = torch.zeros(len(rows), P, dtype=torch.long)
    for i, p in enumerate(rows):  # left padding
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        valid[i, P - len(p) :] = 1
    return ids.to(dev), valid.to(dev)


def _logits(model, ids: Tensor, mask: Tensor, pos: Tensor, cache) -> Tensor:
    """Float32 logits ``[N, V]`` of the last of ``ids`` (at ``pos``, attending ``mask``), which
    ``cache`` keeps."""
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
        **{_cache_kwarg(model): cache},
    )  # fmt: skip
    return out.logits[:, -1].float()


class KVCompressedEngine(HFEngine):
    """Sampling with the sink + window compressed cache (see the module docstring)."""

    def __init__(self, model, tokenizer, sink: int, window: int, own_copy: bool = False):
        if sink < 0 or window < 1:
            raise ValueError(f"kv compression: sink >= 0 and window >= 1, got {sink}, {window}")
        super().__init__(model, tokenizer, own_copy)
        self.sink, self.window = sink, window
        self.stats = {"cache_columns_max": 0, "dense_columns_max": 0}

    def _generate_chunk(self, prompts: list[list[int]], n: int, sp: SamplingParams):
        """``n`` completions of each prompt: a dense prefill, then the decode loop over the
        compressed cache."""
        model = self.model
        was = model.training
        model.eval()
        dev = next(model.parameters()).device
        rows = [p for p in prompts for _ in range(n)]
        ids, valid = _left_padded(rows, max(len(p) for p in prompts), self.pad_id, dev)
        N, L = len(rows), sp.max_new_tokens
        out_tok = torch.full((N, L), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros(N, L, device=dev)
        with torch.inference_mode():
            self._decode(ids, valid, out_tok, out_lp, sp)
        model.train(was)
        toks_all, lp_all = out_tok.cpu(), out_lp.cpu()
        res = []
        for i in range(N):
            toks, reason = self._truncate(toks_all[i].tolist(), sp)
            res.append((rows[i], toks, lp_all[i, : len(toks)].tolist(), reason))
        return res

    def _decode(
        self, ids: Tensor, valid: Tensor, out_tok: Tensor, out_lp: Tensor, sp: SamplingParams
    ) -> None:
        """Prefill the left-padded ``ids`` (``valid``: the real tokens), then sample token by
        token into ``out_tok`` / ``out_lp`` ``[N, L]`` until every row ends."""
        from transformers import DynamicCache

        (N, P), L, dev = ids.shape, sp.max_new_tokens, ids.device
        col_pos = (valid.cumsum(-1) - 1).clamp_min(0)  # [N, C] the cached columns' positions
        cache = DynamicCache()
        done = torch.zeros(N, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=dev)
        greedy = sp.temperature == 0
        q_pos = col_pos[:, -1]  # the last prompt token's position
        logits = _logits(self.model, ids, valid, col_pos, cache)
        for t in range(L):
            if not bool(torch.isfinite(logits[~done]).all()):
                from rlpost.core.guard import NonFiniteError

                raise NonFiniteError(
                    "the policy's logits are not finite at generation: its weights have diverged"
                )
            tok, lp = sample(process_logits(logits, sp), greedy)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            out_tok[:, t], out_lp[:, t] = tok, lp
            done = done | torch.isin(tok, eos)
            if sp.stop and not bool(done.all()):
                done |= self._stopped_rows(out_tok[:, : t + 1], sp.stop).to(dev)
            if t == L - 1 or bool(done.all()):
                break
            q_pos = q_pos + 1  # the new token's position: it queries the compressed cache
            logits, col_pos, valid = self._step(cache, tok, q_pos, col_pos, valid, P + t + 2)

    def _step(
        self, cache, tok: Tensor, q_pos: Tensor, col_pos: Tensor, valid: Tensor, dense: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Feed ``tok`` at ``q_pos`` over the compressed cache (evicting the columns no row
        will attend again first; ``dense``: the columns a dense cache would hold); ``(logits,
        col_pos, valid)`` after it, its column appended."""
        N, dev = len(tok), tok.device
        see = kept(q_pos[:, None], col_pos, self.sink, self.window) & valid.bool()
        # columns no row will attend again (queries only move forward)
        future = col_pos >= q_pos[:, None] - self.window + 1
        sinks = (col_pos < self.sink) & valid.bool()
        keep = (future | sinks).any(0)
        if not bool(keep.all()):
            idx = torch.nonzero(keep).flatten()
            for layer in cache.layers:
                layer.keys = layer.keys[:, :, idx]
                layer.values = layer.values[:, :, idx]
            col_pos, valid, see = col_pos[:, idx], valid[:, idx], see[:, idx]
        self.stats["cache_columns_max"] = max(
            self.stats["cache_columns_max"], int(col_pos.shape[1]) + 1
        )
        self.stats["dense_columns_max"] = max(self.stats["dense_columns_max"], dense)
        mask = torch.cat([see.long(), torch.ones(N, 1, dtype=torch.long, device=dev)], 1)
        logits = _logits(self.model, tok[:, None], mask, q_pos[:, None], cache)
        col_pos = torch.cat([col_pos, q_pos[:, None]], 1)
        valid = torch.cat([valid, torch.ones(N, 1, dtype=torch.long, device=dev)], 1)
        return logits, col_pos, valid
