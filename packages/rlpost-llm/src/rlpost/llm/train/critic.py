"""The value model for PPO with a critic (GAE advantages; SAO's value baseline).

A :class:`ValueModel` is a scalar head on a decoder: ``V(s_t)`` for every completion
position ``t`` is the head applied to the decoder's last hidden state at the position
that predicts completion token ``t`` (the state before the token is emitted). The decoder
is a copy of the policy's (``critic.model: policy``, the verl / OpenRLHF default: critic
and actor start from the same weights) or a separate Hugging Face model
(``critic.model: <path or hub id>``), optionally with LoRA adapters. It has its own
optimiser, learning rate and gradient clip, and is checkpointed beside the policy.

Value loss (PPO's clipped value objective, as verl's ``compute_value_loss``)::

    V~   = V_old + clip(V - V_old, -c, c)
    L_v  = 0.5 * max((V - R)^2, (V~ - R)^2)          per valid token, ``[B, T]``
    loss = sum_{b,t} m L_v / N_tokens(global)        (micro-batches sum to the full batch)

with ``R`` the GAE returns (``AdvantageOutput.returns``) and ``V_old`` the values the
advantages were computed from. ``c = None`` disables the clip.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from rlpost.llm.model.policy import DTYPES, SeqBatch, apply_lora, fused_head
from rlpost.llm.train.parallel import Learner


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    dec = fused_head(base)
    if dec is not None:
        return dec[0]
    get = getattr(base, "get_decoder", None)
    if get is None:
        raise ValueError(f"{type(base).__name__} exposes no decoder (get_decoder) for a critic")
    return get()


class ValueHeadModel(torch.nn.Module):
    """``decoder`` + ``Linear(hidden, 1)``: per-position values of a :class:`SeqBatch`."""

    def __init__(self, decoder: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.decoder = decoder
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.normal_(self.head.weight, std=1.0 / (hidden_size + 1))
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, sb: SeqBatch) -> Tensor:
        """``[B, L]`` float32 values ``V(s_t)`` of the completion positions."""
        dev = self.head.weight.device
        h = self.decoder(
            input_ids=sb.input_ids.to(dev),
            attention_mask=sb.attention_mask.to(dev),
            position_ids=sb.position_ids.to(dev),
            use_cache=False,
        ).last_hidden_state
        L = sb.targets.shape[1]
        return self.head(h[:, sb.P - 1 : sb.P - 1 + L]).squeeze(-1).float()


def build_value_model(cfg: Any, policy: torch.nn.Module, dtype: str) -> ValueHeadModel:
    """The critic of ``cfg``: a deep copy of ``policy``'s decoder, or a separate model."""
    if cfg.model == "policy":
        decoder = copy.deepcopy(_decoder(policy))
        hidden = policy.config.hidden_size
    else:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=DTYPES[dtype])
        decoder, hidden = _decoder(lm), lm.config.hidden_size
    decoder.requires_grad_(True)
    if cfg.lora is not None:
        decoder = apply_lora(decoder, cfg.lora)
    dev = next(policy.parameters()).device
    return ValueHeadModel(decoder, hidden).to(dev)


def _apply(module: torch.nn.Module, sb: SeqBatch) -> Tensor:
    return module(sb)


class ValueModel:
    """The critic, its optimiser and its clipped value loss (see the module docstring)."""

    def __init__(self, cfg: Any, policy: torch.nn.Module, dtype: str = "float32"):
        self.cfg = cfg
        self.module = build_value_model(cfg, policy, dtype)
        self.learner = Learner(self.module)  # DDP when data-parallel
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    @torch.no_grad()
    def values(self, batches: list[SeqBatch]) -> Tensor:
        """``[N, L]`` values of the rows of ``batches`` (eval mode, no gradient)."""
        was = self.module.training
        self.module.eval()
        try:
            return torch.cat([self.module(sb).cpu() for sb in batches])
        finally:
            self.module.train(was)

    def loss(
        self,
        sb: SeqBatch,
        old_values: Tensor,
        returns: Tensor,
        mask: Tensor,
        global_tokens: float,
    ) -> tuple[Tensor, dict[str, float]]:
        """Clipped value loss of one micro-batch (``[B, L]`` inputs), globally normalised."""
        self.module.train()
        v = self.learner(_apply, sb)
        dev = v.device
        old, R, m = old_values.to(dev), returns.to(dev), mask.to(dev).float()
        err = (v - R) ** 2
        if self.cfg.clip is not None:
            vc = old + (v - old).clamp(-self.cfg.clip, self.cfg.clip)
            clipped = (vc - R) ** 2
            per_tok = 0.5 * torch.maximum(err, clipped)
            clip_frac = float(((clipped > err).float() * m).sum())
        else:
            per_tok, clip_frac = 0.5 * err, 0.0
        loss = (per_tok * m).sum() / max(global_tokens, 1.0)
        return loss, {
            "value/loss": float(loss.detach()),
            "value/clip_tokens": clip_frac,
            "value/mean": float((v.detach() * m).sum() / m.sum().clamp_min(1.0)),
        }

    def step(self) -> float:
        """Clip the critic's gradient, step its optimiser; returns the gradient norm."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if torch.isfinite(torch.tensor(norm)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over valid tokens: 1 for a perfect critic, <= 0 for
    one no better than a constant."""
    m = mask.bool()
    if m.sum() < 2:
        return 0.0
    r, v = returns[m].double(), values[m].double()
    var = r.var()
    return float(1.0 - (r - v).var() / var) if var > 0 else 0.0
