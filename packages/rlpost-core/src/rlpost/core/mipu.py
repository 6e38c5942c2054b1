"""MIPU's acceptance test (catalog 004-26): does a candidate update improve the inference
policy?

Training and inference engines assign the same trajectory different probabilities, so an
update that raises the training-side objective need not raise the *inference* policy's,
the one that samples and is deployed. MIPU (Monotonic Inference Policy Update) builds a
candidate update referenced to the sampler (its importance ratios against the sampler's
own log-probs), synchronises it to the inference engine, and accepts it only if an
inference-side proxy says the inference policy improved.

Our proxy, on the batch the candidate was trained on: with ``d_t = log mu'(y_t) -
log mu(y_t)`` the inference engine's log-prob change of each sampled token (``mu`` the
sampler that generated it, ``mu'`` the engine on the candidate weights) and ``A_t`` the
token advantages,

* ``gain = sum_t m_t A_t (exp(d_t) - 1) / sum_t m_t``: the importance-weighted surrogate
  improvement of the inference policy (the first-order term of its expected-advantage
  change; 0 for an unchanged policy);
* ``kl = sum_t m_t (exp(-d_t) - 1 + d_t) / sum_t m_t``: the k3 estimate of
  ``KL(mu || mu')`` on the sampled tokens;

and the candidate is accepted when ``gain - penalty * kl >= min_gain`` (a lower bound in
the spirit of monotonic-improvement theory when ``penalty`` is large enough).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class InferenceGap:
    gain: float  # the surrogate improvement of the inference policy
    kl: float  # KL(mu || mu') on the sampled tokens (k3)

    def accepts(self, penalty: float = 0.0, min_gain: float = 0.0) -> bool:
        score = self.gain - penalty * self.kl
        return score == score and score >= min_gain  # (a NaN never accepts)


def inference_gap(
    candidate_logp: Tensor, sampler_logp: Tensor, advantages: Tensor, mask: Tensor
) -> InferenceGap:
    """``[B, T]`` inference-side log-probs of the sampled tokens on the candidate weights
    and at sampling, ``[B, T]`` (or ``[B]``) advantages and the ``[B, T]`` loss mask."""
    m = mask.double()
    adv = advantages.double()
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(m)
    d = (candidate_logp.double() - sampler_logp.double()) * m
    n = m.sum().clamp_min(1.0)
    gain = (m * adv * (d.exp() - 1)).sum() / n
    kl = (m * ((-d).exp() - 1 + d)).sum() / n
    return InferenceGap(float(gain), float(kl))


__all__ = ["InferenceGap", "inference_gap"]
