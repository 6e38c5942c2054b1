"""Token weightings (the ``TOKEN_WEIGHTINGS`` registry): per-token loss weights from a
per-token signal, ``fn(TokenWeightInput, params) -> TokenWeightOutput``.

The signal is the attention entropy of each response token (catalog 001-08; see
:mod:`rlpost.core.weights.attention`), ``[B, T]`` like the policy loss. The weights are
detached and multiply the importance-correction weights inside
:meth:`rlpost.core.presets.Recipe.policy_loss` (``PolicyBatch.token_weights``): they scale
the policy-gradient term only. Compute them on the whole step's batch, then slice per
micro-batch, and keep the loss normaliser the full batch's token count.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlpost.core.advantages.base import TrainingDynamics
from rlpost.core.contract import Input
from rlpost.core.registry import Registry


@dataclass(frozen=True)
class TokenWeightInput:
    entropy: Tensor  # [B, T] per-token signal (attention entropy, nats)
    mask: Tensor  # [B, T]
    dynamics: TrainingDynamics | None = None  # progress, for scheduled weightings

    def __post_init__(self) -> None:
        if self.entropy.dim() != 2 or self.entropy.shape != self.mask.shape:
            raise ValueError(
                f"entropy and mask must both be [B, T], got {tuple(self.entropy.shape)} and "
                f"{tuple(self.mask.shape)}"
            )


@dataclass(frozen=True)
class TokenWeightOutput:
    weights: Tensor  # [B, T] detached, 0 on masked tokens
    metrics: dict[str, float]


TOKEN_WEIGHTINGS: Registry[TokenWeightInput, TokenWeightOutput] = Registry(
    "token weighting",
    TokenWeightInput,
    TokenWeightOutput,
    inputs={Input.DYNAMICS: ("dynamics",)},
    gated=(Input.DYNAMICS,),
)
