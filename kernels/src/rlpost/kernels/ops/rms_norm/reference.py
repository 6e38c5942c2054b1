"""RMSNorm as the Llama / Mistral / Qwen2 / Qwen3 decoders of transformers compute it:
the statistics in float32, the normalised row cast back to the input's dtype, then the
weight. ``y = w * (x / sqrt(mean(x^2) + eps)).to(dtype)``."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight * (x * rsqrt(mean(x^2, -1) + eps)).to(x.dtype)``, statistics in float32."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
