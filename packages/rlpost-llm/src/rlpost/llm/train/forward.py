"""The trainer's forwards of a policy over a rollout batch.

The device boundary is one function, :func:`host_logprobs`: the forward, the fused head
and their backward run on the model's device and the ``[B, L]`` log-probs and entropies
come back to the CPU, differentiably, where the trainer keeps its per-token state (masks,
advantages, the loss). :class:`Forwards` builds the micro-batches' sequence batches the
way the run packs them (shared-prompt packing, the compressed-KV learner's shadow mask)
and runs the no-grad passes (pi_old, the reference, an engine's copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rlpost.llm.model.policy import completion_logprobs, make_seq_batch
from rlpost.llm.rollout.engines.base import RolloutBatch


def to_host(x: Any) -> Any:
    """``x`` (a tensor, or tuples of them) on the CPU, where the trainer keeps its per-token
    state; differentiable, so a loss computed there sends its gradient back to the
    model's device. A no-op for CPU tensors."""
    if isinstance(x, Tensor):
        return x if x.device.type == "cpu" else x.cpu()
    if isinstance(x, tuple):
        return tuple(to_host(v) for v in x)
    return x


def host_logprobs(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """:func:`~rlpost.llm.model.policy.completion_logprobs` on the model's device, its
    ``[B, L]`` results on the host (:func:`to_host`)."""
    return to_host(completion_logprobs(model, *args, **kwargs))


def merged_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """Full weights for an external engine: LoRA adapters merged, PEFT prefixes removed."""
    if not hasattr(model, "merge_adapter"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()
    sd = {
        k.replace("base_model.model.", "", 1).replace(".base_layer", ""): v.detach().clone()
        for k, v in model.state_dict().items()
        if "lora_" not in k
    }
    model.unmerge_adapter()
    return sd


@dataclass
class Forward:
    """One no-grad pass of a policy over a rollout batch (all ``[N, L]``, masked)."""

    logp: Tensor
    entropy: Tensor | None = None
    dists: tuple[Tensor, Tensor] | None = None  # (ids, logp) [N, L, K]


class Forwards:
    """The run's forwards (see the module docstring). ``kv``: the compressed-KV learner's
    ``(sink, window)`` shadow pattern (None: dense attention)."""

    def __init__(self, cfg: Any, learner: Any, model: torch.nn.Module, temperature: float, kv=None):
        self.cfg, self.learner, self.model = cfg, learner, model
        self.temperature = temperature
        self.kv = kv
        self.sharded = learner.sharded
        from rlpost.llm.model.packing import supports_shared_attention
        from rlpost.llm.model.policy import decoder_cost, pack_layout

        self.cost = decoder_cost(getattr(model, "module", model))  # (per position, per pair)
        self.layout = pack_layout(cfg.model.pack_layout, model)
        # the ragged layout may attend by sequence (no dense mask) where the model can
        self.sequences = supports_shared_attention(getattr(model, "module", model))

    def seq_batch(
        self,
        sub: RolloutBatch,
        rows: slice | Tensor | None = None,
        *,
        dense: bool = False,
        pack: bool | None = None,
    ) -> Any:
        """Rows ``rows`` of ``sub`` (all: None) as the learner scores them (``dense``:
        full context and no packing: the critic's view, the shadow policy's reference)."""

        def take(x):
            return x if rows is None else x[rows]

        prompts = sub.prompt_ids if rows is None else _take_list(sub.prompt_ids, rows)
        args = (prompts, take(sub.completion_ids), take(sub.mask), sub.pad_id)
        if dense:
            return make_seq_batch(*args, attend=take(sub.attention))
        m = self.cfg.model
        return make_seq_batch(
            *args, pack=m.pack_prompts if pack is None else pack, layout=self.layout,
            attend=take(sub.attention), kv=self.kv, min_gain=m.pack_min_gain, cost=self.cost,
            sequences=self.sequences,
        )  # fmt: skip

    def seq_batches(self, batch: RolloutBatch, pack: bool | None = None):
        """``(rows, seq batch)`` per micro-batch of ``batch``."""
        mbs = self.cfg.optim.micro_batch_size
        for s in range(0, len(batch), mbs):
            sl = slice(s, s + mbs)
            yield sl, self.seq_batch(batch, sl, pack=pack)

    def _rows(self, batch: RolloutBatch, rows: slice | None, call: Any) -> Any:
        """``call(seq batch)`` over ``rows`` of ``batch`` (all: None): at once, or with
        ``model.batch_invariant`` one row at a time, the outputs concatenated, so that a
        row's log-probs are bitwise the same whichever rows share its micro-batch (and the
        training forward's equal the no-grad scoring's)."""
        if not self.cfg.model.batch_invariant:
            return call(self.seq_batch(batch, rows))
        idx = range(len(batch))[rows] if rows is not None else range(len(batch))
        return _cat([call(self.seq_batch(batch, slice(i, i + 1))) for i in idx])

    def train(self, sub: RolloutBatch, **kwargs: Any) -> tuple:
        """The differentiable training forward of a micro-batch, through the data-parallel
        learner."""
        impl = self.cfg.model.logprob_impl
        return self._rows(
            sub,
            None,
            lambda sb: self.learner(host_logprobs, sb, self.temperature, impl=impl, **kwargs),
        )

    @torch.no_grad()
    def nograd(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        entropy: bool = False,
        dists: bool = False,
    ) -> Forward:
        """Log-probs of the sampled tokens under ``model`` (and, on request, the
        per-position entropy and the top-``algo.topk`` distribution), in micro-batches."""
        mask = batch.mask
        out = torch.zeros_like(mask)
        ent = torch.zeros_like(mask) if entropy else None
        ids_parts, lp_parts = [], []
        sharded = self.sharded and model is self.model
        topk = self.cfg.algo.topk if dists else None
        impl = self.cfg.model.logprob_impl

        def call(sb: Any) -> Any:
            if sharded:  # FSDP2: through the learner, which gathers the shards
                return self.learner(host_logprobs, sb, self.temperature, impl=impl, dists=topk)
            return host_logprobs(model, sb, self.temperature, impl=impl, dists=topk)

        mbs = self.cfg.optim.micro_batch_size
        for s in range(0, len(batch), mbs):
            sl = slice(s, s + mbs)
            res = self._rows(batch, sl, call)
            out[sl] = res[0] * mask[sl]
            if ent is not None:
                ent[sl] = res[1] * mask[sl]
            if dists:
                ids_parts.append(res[2][0])  # (host_logprobs: on the CPU already)
                lp_parts.append(res[2][1])
        d = (torch.cat(ids_parts), torch.cat(lp_parts)) if dists else None
        return Forward(out, ent, d)


def _cat(parts: list) -> Any:
    """Per-row forward outputs (tensors with rows first, ``None``, tuples of them) joined."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        return torch.cat(parts)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _cat([p[k] for p in parts]) for k in first}
    raise TypeError(f"cannot join per-row forward outputs of type {type(first).__name__}")


def _take_list(xs: list, rows: slice | Tensor) -> list:
    return xs[rows] if isinstance(rows, slice) else [xs[i] for i in rows.tolist()]
