"""Schulman's k1 / k2 / k3 estimators and the in-reward KL penalty."""

from __future__ import annotations

from torch import Tensor

from rlpost.core.kl.base import KL_ESTIMATORS, KLInput, KLOutput, KLParams, _finish, _log_ratio
from rlpost.core.registry import Bound


@KL_ESTIMATORS.register("k1", KLParams)
def k1(inp: KLInput, p: KLParams) -> KLOutput:
    """k1 = log pi - log pi_ref (unbiased value, high variance; E[grad] = 0 as a loss)."""
    lr = _log_ratio(inp, p)
    return _finish(lr, lr, inp, p)


@KL_ESTIMATORS.register("k2", KLParams)
def k2(inp: KLInput, p: KLParams) -> KLOutput:
    """k2 = (log pi - log pi_ref)^2 / 2 (biased value, low variance; gradient = reverse KL's)."""
    lr = _log_ratio(inp, p)
    return _finish(0.5 * lr**2, lr, inp, p)


@KL_ESTIMATORS.register("k3", KLParams)
def k3(inp: KLInput, p: KLParams) -> KLOutput:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi) = exp(-lr) - 1 + lr (unbiased, >= 0, low variance)."""
    lr = _log_ratio(inp, p)
    return _finish((-lr).exp() - 1.0 + lr, lr, inp, p)


def kl_reward_penalty(
    logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float, estimator: str | Bound = "k1"
) -> Tensor:
    """Dense, detached token rewards ``-beta * k(logp, ref_logp)`` ``[B, T]`` for in-reward KL.

    ``estimator``: a bound ``KL_ESTIMATORS`` entry (a recipe's ``Recipe.kl``, its params
    honoured) or a name (the entry with its default params)."""
    bound = KL_ESTIMATORS.build(estimator) if isinstance(estimator, str) else estimator
    kl = bound(KLInput(logp.detach(), ref_logp.detach(), mask)).kl
    return -beta * kl
