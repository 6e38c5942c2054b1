"""The value-gradient view of critic-free RL (catalog 000-11's study): how much a policy can
gain from RL, measured as value-gradient signal times reachable reward headroom.

For a prompt ``x`` and ``k`` sampled responses ``y_1..y_k`` with rewards ``r_i``, the
leave-one-out estimator

```
g(x) = (1/k) sum_i (r_i - b_i) grad log pi(y_i | x),    b_i = mean_{j != i} r_j
```

is unbiased for the value gradient ``grad J(x) = grad E_{y ~ pi}[r(x, y)]``: ``b_i`` does
not depend on ``y_i``, so it drops out in expectation. That is the paper's first result in
our setting: the backward pass of a critic-free update carries, in expectation, the value
gradient (:func:`loo_weights` gives the ``(r_i - b_i) / k``).

A prompt's own signal is the norm of its value gradient, ``||grad J(x)||^2``, estimated
without bias from the Gram matrix ``G_ij = <grad log pi(y_i), grad log pi(y_j)>`` of its
samples (:func:`prompt_signal_sq`): the mean over pairs ``i != j`` of
``(r_i - c_ij)(r_j - c_ij) G_ij``, with ``c_ij`` the mean reward of the other ``k - 2``
samples (independent of ``y_i`` and ``y_j``, so it only lowers the variance).

Over ``P`` prompts with per-prompt estimates ``g_p``, two numbers separate the shared
direction from noise without storing the ``g_p`` (:class:`GradientMoments`, streaming):

* batch signal: ``||E_x g||^2``, estimated without bias as
  ``(||sum_p g_p||^2 - sum_p ||g_p||^2) / (P (P - 1))`` (the mean of ``<g_p, g_q>`` over
  pairs ``p != q``; a single prompt's own noise does not count);
* noise: the trace of the per-prompt covariance, ``sum_p ||g_p - g_mean||^2 / (P - 1)``.

Headroom is what the policy's own samples can reach and it does not yet get: for rewards
``[P, k]``, the reachable reward ``E_x max_i r_i`` (pass@k for a 0/1 reward) minus the
mean ``E_x mean_i r_i`` (pass@1). RL moves probability toward responses the policy already
samples, so a reward no sample reaches is not headroom, and a prompt whose samples are all
right has none. The criterion is their product, signal times headroom: zero for a policy
that never succeeds (no signal) and for one that always does (no headroom), largest in
between, which is where along a pre-training trajectory the paper expects RL to help most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor


def loo_weights(rewards: Tensor) -> Tensor:
    """``(r_i - mean_{j != i} r_j) / k`` per response, for rewards ``[..., k]`` (``k >= 2``):
    the weights of ``log pi(y_i)`` in the unbiased value-gradient estimate of a group."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError(f"the leave-one-out baseline needs k >= 2 samples, got {k}")
    others = (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    return (rewards - others) / k


def prompt_signal_sq(rewards: Tensor, gram: Tensor) -> float:
    """Unbiased ``||grad J(x)||^2`` of one prompt from its ``k >= 3`` samples' rewards
    ``[k]`` and the Gram matrix ``[k, k]`` of their ``grad log pi`` (leave-two-out
    baseline); may be negative by noise."""
    k = rewards.shape[0]
    if k < 3 or gram.shape != (k, k):
        raise ValueError(f"need k >= 3 rewards and a [k, k] Gram matrix, got {k}, "
                         f"{tuple(gram.shape)}")  # fmt: skip
    r = rewards.double()
    c = (r.sum() - r[:, None] - r[None, :]) / (k - 2)
    terms = (r[:, None] - c) * (r[None, :] - c) * gram.double()
    return float((terms.sum() - terms.diagonal().sum()) / (k * (k - 1)))


def headroom(rewards: Tensor) -> dict[str, float]:
    """Mean, reachable (best of the ``k`` samples) and headroom (their difference) of
    rewards ``[P, k]``, each averaged over the ``P`` prompts."""
    if rewards.dim() != 2 or rewards.shape[1] < 1:
        raise ValueError(f"rewards must be [prompts, samples], got {tuple(rewards.shape)}")
    mean = rewards.mean(1).mean().item()
    reachable = rewards.max(1).values.mean().item()
    return {"mean_reward": mean, "reachable_reward": reachable, "headroom": reachable - mean}


@dataclass
class GradientMoments:
    """Streaming first and second moments of per-prompt gradient estimates (flattened):
    the batch signal, the noise and their ratio."""

    total: Tensor | None = None
    sq_norms: float = 0.0
    count: int = 0
    _norms: list[float] = field(default_factory=list)

    def add(self, g: Tensor) -> None:
        g = g.detach().double().flatten()
        self.total = g.clone() if self.total is None else self.total + g
        n = float(g.square().sum())
        self.sq_norms += n
        self._norms.append(math.sqrt(n))
        self.count += 1

    def signal_sq(self) -> float:
        """Unbiased ``||E g||^2`` (may be negative by noise; needs two prompts)."""
        P = self.count
        if P < 2 or self.total is None:
            raise ValueError(f"the signal needs gradients of at least 2 prompts, got {P}")
        return (float(self.total.square().sum()) - self.sq_norms) / (P * (P - 1))

    def noise(self) -> float:
        """The trace of the per-prompt covariance, ``sum ||g_p - mean||^2 / (P - 1)``."""
        P = self.count
        if P < 2 or self.total is None:
            raise ValueError(f"the noise needs gradients of at least 2 prompts, got {P}")
        return (self.sq_norms - float(self.total.square().sum()) / P) / (P - 1)

    def summary(self) -> dict[str, float]:
        s2 = self.signal_sq()
        noise = self.noise()
        return {
            "batch_signal": math.sqrt(max(s2, 0.0)),
            "batch_signal_sq": s2,
            "noise": noise,
            "snr": s2 / noise if noise > 0 else 0.0,
            "mean_prompt_norm": sum(self._norms) / len(self._norms),
        }


def criterion(signal: float, room: float) -> float:
    """The paper's decomposition as one number: value-gradient signal times headroom."""
    return signal * room
