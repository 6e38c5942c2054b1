"""REVA-PO's response-weighted KL, RER (catalog 004-09): the ``reva_rer`` KL estimator.

Its companion, VAPR (reset the policy and the reference to the best validation
checkpoint), is a trainer step hook the preset names (``Preset.hooks``: ``validation_reset``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from rlpost.core.contract import Coupling, Input
from rlpost.core.kl.base import KL_ESTIMATORS, KLInput, KLOutput, KLParams
from rlpost.core.kl.estimators import k1, k2, k3
from rlpost.core.masked import masked_mean


@dataclass(frozen=True)
class ResponseWeightedKLParams:
    alpha: float = 0.5  # advantage sensitivity
    gamma: float = 0.5  # reference-entropy sensitivity (per nat)
    w_min: float = 0.1
    w_max: float = 10.0
    estimator: Literal["k1", "k2", "k3"] = "k3"
    straight_through: bool = False
    clamp: float | None = 10.0
    # centre of the reference entropy (nats per token). A fixed centre keeps the loss
    # split-invariant (micro-batching = full batch); None: the mean over the valid tokens
    # of the tensors passed in (each micro-batch its own mean: not split-invariant)
    entropy_center: float | None = 0.0

    def __post_init__(self) -> None:
        if self.entropy_center is not None and not math.isfinite(self.entropy_center):
            raise ValueError(f"entropy_center must be finite or None, got {self.entropy_center}")
        if self.alpha < 0 or self.gamma < 0:
            raise ValueError(f"alpha and gamma must be >= 0, got {self.alpha}, {self.gamma}")
        if not 0 < self.w_min <= 1.0 <= self.w_max:
            raise ValueError(f"need 0 < w_min <= 1 <= w_max, got {self.w_min}, {self.w_max}")
        if self.estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"estimator must be k1, k2 or k3, got {self.estimator!r}")


def reva_response_weights(
    advantages: Tensor,
    ref_entropy: Tensor,
    mask: Tensor | None,
    p: ResponseWeightedKLParams,
) -> Tensor:
    """Detached per-response KL weights ``[B]`` of REVA-PO's RER (catalog 004-09).

        a_i = A_i ([B]) or the masked mean of A_i,t ([B, T])
        h_i = masked mean over t of H_ref,t - c       (c = ``entropy_center``)
        w_i = clip(exp(-alpha a_i - gamma h_i), w_min, w_max)

    High-advantage responses get a smaller weight (constraint relaxed), low-advantage ones
    a larger weight (tightened), as the abstract states. The entropy direction is our
    reading: where the reference is uncertain (high entropy) it is a weaker anchor, so the
    constraint is relaxed there. The centre c only rescales every weight by exp(gamma c),
    i.e. the effective ``kl_coef``: set it near the typical reference entropy per token to
    keep the typical response at w ~ 1 (with the default c = 0 the weights are
    exp(-gamma H) < 1 and ``kl_coef`` acts smaller). A fixed c keeps micro-batching exact;
    ``None`` centres on the mean of the tensors passed in, i.e. of each micro-batch under
    gradient accumulation, so the loss then depends (slightly) on the split. Masked
    entries are never read (``-inf`` / NaN padding is harmless).
    """
    B = advantages.shape[0]
    H = ref_entropy.detach()
    A = advantages.detach().to(H.dtype)
    a = A if A.dim() == 1 else masked_mean(A, mask, dim=1)
    h_resp = masked_mean(H, mask, dim=1)
    centre = masked_mean(H, mask) if p.entropy_center is None else p.entropy_center
    h = h_resp - centre  # relative to the fixed centre (or the passed tensors' mean)
    w = torch.exp(-p.alpha * a - p.gamma * h).clamp(p.w_min, p.w_max)
    return w.reshape(B)


_BASE = {"k1": k1, "k2": k2, "k3": k3}


def _reva_coupling(p: ResponseWeightedKLParams) -> Coupling:
    """A fixed entropy centre keeps each row's weight its own; ``None`` centres on the
    mean over the whole call (so the loss depends on how the batch is split)."""
    return Coupling.ROW if p.entropy_center is not None else Coupling.BATCH


@KL_ESTIMATORS.register(
    "reva_rer",
    ResponseWeightedKLParams,
    needs={Input.ADVANTAGES},
    reads={Input.REF_ENTROPY},
    coupling=_reva_coupling,
)
def reva_rer(inp: KLInput, p: ResponseWeightedKLParams) -> KLOutput:
    """REVA-PO response-weighted KL (RER, catalog 004-09), ``[B, T]``.

        kl_i,t = sg(w_i) * k(log pi_i,t - log pi_ref_i,t) * m_i,t

    ``k``: the ``estimator`` (k1 / k2 / k3, see :mod:`rlpost.core.kl`), ``w_i`` from
    :func:`reva_response_weights`. Needs ``KLInput.advantages`` (``[B]`` or ``[B, T]``;
    :meth:`Recipe.policy_loss` passes them). The reference entropy is
    ``KLInput.ref_entropy`` when given, else the sampled-token estimate ``-log pi_ref(y_t)``
    (cross-entropy of the sample under the reference; exact entropy needs the reference's
    logits). The weight is detached, so the gradient is ``w_i`` times the base estimator's.
    Not usable as an in-reward KL (``kl_reward_penalty`` has no advantages).
    """
    if inp.advantages is None:
        raise ValueError(
            "reva_rer needs KLInput.advantages ([B] or [B, T]) for its per-response weights"
        )
    base = _BASE[p.estimator](inp, KLParams(p.straight_through, p.clamp)).kl
    H = inp.ref_entropy if inp.ref_entropy is not None else -inp.ref_logp
    w = reva_response_weights(inp.advantages, H.detach().to(base.dtype), inp.mask, p)
    return KLOutput(base * w[:, None])
