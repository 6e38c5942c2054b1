"""The compressed-KV learner's distillation term (001-13, ``rollout.kv_compression``
with ``correction: shadow`` and ``distill > 0``): ``distill * 0.5 (log pi_shadow(y) - sg
log pi_dense(y))^2`` over the sampled tokens, normalised by the step's valid tokens (so
micro-batches sum to the full batch): the policy under the sampler's compressed context,
the one being trained, pulled towards the full-context policy on its own samples, so the
two views drift no further apart; 0 in value and gradient when they agree."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlpost.llm.train.forward import host_logprobs
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


@STEP_HOOKS.register
class ShadowDistillHook(StepHook):
    name = "kv_distill"
    label = "rollout.kv_compression.distill"

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        kv = cfg.rollout.kv_compression
        return kv is not None and kv.shadow is not None and kv.distill > 0

    def extra_loss(self, mb: Any, logp: Tensor, acc: Any) -> Tensor | None:
        t = self.trainer
        if t.forwards.kv is None:  # (a learner told to score densely: no shadow to pull)
            return None
        m = mb.step.mask[mb.idx]
        dense = t.forwards.seq_batch(mb.sub, dense=True)
        with torch.no_grad():
            impl = t.cfg.model.logprob_impl
            logp_d = host_logprobs(t.model, dense, t.sampling.temperature, impl=impl)[0]
        gap = (logp - logp_d) * m
        acc.add({"kv/dense_gap": float(gap.detach().abs().sum() / m.sum().clamp_min(1.0))})
        beta = t.cfg.rollout.kv_compression.distill
        return beta * 0.5 * (gap**2).sum() / max(mb.step.counts()[0], 1.0)
