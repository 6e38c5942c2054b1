"""The gated activation of the Llama / Mistral / Qwen2 / Qwen3 MLPs, as transformers
computes it: ``silu(gate) * up``, each product in the tensors' dtype."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def swiglu_reference(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` (the MLP's input to its down projection)."""
    return F.silu(gate) * up
