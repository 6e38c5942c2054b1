"""KL estimators between the policy and a reference, per token, with their gradients.

Signature ``fn(KLInput, params) -> KLOutput``. With samples y ~ pi and
``lr = log pi(y) - log pi_ref(y)`` (``[B, T]``), Schulman's estimators of KL(pi || pi_ref)
(http://joschu.net/blog/kl-approx.html) are

    k1 = lr                          grad k1 = grad log pi
    k2 = lr^2 / 2                    grad k2 = lr * grad log pi
    k3 = exp(-lr) - 1 + lr           grad k3 = (1 - exp(-lr)) * grad log pi

All three are unbiased or low-bias *values*, but as losses their gradients differ: under
y ~ pi, E[grad k2] = grad KL(pi || pi_ref) (the reverse KL one means to penalise), while
E[grad k1] = 0 and E[grad k3] = -sum_y pi_ref(y) grad log pi(y) = grad KL(pi_ref || pi) (the
forward KL). ``straight_through=True`` keeps the k1/k3 *value* (for logging and the reward)
but uses k2's gradient: value + (k2 - sg(k2)), so in-loss use optimises the reverse KL.

In-reward use (PPO / REINFORCE++): :func:`kl_reward_penalty` gives detached dense token
rewards ``-beta * k``; no gradient flows through the reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.registry import Registry


@dataclass(frozen=True)
class KLInput:
    logp: Tensor  # [B, T] log pi (differentiable)
    ref_logp: Tensor  # [B, T] log pi_ref (detached)
    mask: Tensor | None = None  # [B, T]
    advantages: Tensor | None = None  # [B] or [B, T], read by response-weighted KLs (reva_rer)
    ref_entropy: Tensor | None = None  # [B, T] entropy of pi_ref per position (reva_rer)

    def __post_init__(self) -> None:
        if self.logp.shape != self.ref_logp.shape:
            raise ValueError(
                f"logp {tuple(self.logp.shape)} and ref_logp {tuple(self.ref_logp.shape)} differ"
            )
        if self.mask is not None and self.mask.shape != self.logp.shape:
            raise ValueError(
                f"mask shape {tuple(self.mask.shape)} != logp {tuple(self.logp.shape)}"
            )
        a = self.advantages
        if a is not None and a.shape not in (self.logp.shape, self.logp.shape[:1]):
            raise ValueError(f"advantages must be [B] or [B, T], got {tuple(a.shape)}")
        h = self.ref_entropy
        if h is not None and h.shape != self.logp.shape:
            raise ValueError(f"ref_entropy shape {tuple(h.shape)} != logp {tuple(self.logp.shape)}")


@dataclass(frozen=True)
class KLOutput:
    kl: Tensor  # [B, T] per-token estimate, 0 on masked tokens


@dataclass(frozen=True)
class KLParams:
    straight_through: bool = False  # value of this estimator, gradient of k2
    clamp: float | None = 10.0  # |lr| bound before the estimator (numerical safety); None: off


KL_ESTIMATORS: Registry[KLInput, KLOutput] = Registry(
    "KL estimator",
    KLInput,
    KLOutput,
    inputs={Input.ADVANTAGES: ("advantages",), Input.REF_ENTROPY: ("ref_entropy",)},
    gated=(Input.ADVANTAGES, Input.REF_ENTROPY),
)


def _log_ratio(inp: KLInput, p: KLParams) -> Tensor:
    """log pi - log pi_ref ``[B, T]``, exactly 0 on masked tokens (``-inf`` padding never read)."""
    lr = inp.logp - inp.ref_logp.detach()
    if inp.mask is not None:
        lr = torch.where(inp.mask > 0, lr, torch.zeros_like(lr))
    return lr if p.clamp is None else lr.clamp(-p.clamp, p.clamp)


def _finish(value: Tensor, lr: Tensor, inp: KLInput, p: KLParams) -> KLOutput:
    if p.straight_through:
        k2 = 0.5 * lr**2
        value = value.detach() + (k2 - k2.detach())
    if inp.mask is not None:
        value = value * inp.mask.to(value.dtype)
    return KLOutput(value)
