"""Velocity-local methods: RAM, AWM and reward-weighted regression (RWR).

The model samples clean endpoints with the ODE, they are scored, re-noised as in
pretraining (``x = (1 - sigma) x0 + sigma eps``, target ``u = eps - x0``) and the velocity
is regressed to a method-specific target: no SDE rollouts, log-probabilities or reward
gradients (:mod:`rlpost.diffusion.objectives`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.core.contract import Input
from rlpost.core.presets import Choice
from rlpost.core.registry import NoParams
from rlpost.diffusion import objectives as obj
from rlpost.diffusion.methods.base import (
    LossInput,
    LossOutput,
    Method,
    register_method,
)


@dataclass(frozen=True)
class RAMParams:
    m: float = 30.0  # RAM strength (1 / KL weight)

    def __post_init__(self) -> None:
        if not self.m > 0:
            raise ValueError(f"m must be > 0, got {self.m}")


def ram(inp: LossInput, p: RAMParams) -> LossOutput:
    """Reinforce Adjoint Matching (catalog 001-01): regress to
    ``v_ref + m A (u - v_old)`` (:func:`rlpost.diffusion.objectives.ram_target`)."""
    target = obj.ram_target(inp.v_ref, inp.v_old, inp.target, inp.advantages, p.m)
    return LossOutput(obj.regression_loss(inp.v, target))


def awm(inp: LossInput, p: NoParams) -> LossOutput:
    """Advantage-weighted matching: ``A ||v - u||^2``."""
    return LossOutput(obj.awm_loss(inp.v, inp.target, inp.advantages))


def rwr(inp: LossInput, p: NoParams) -> LossOutput:
    """Reward-weighted regression: ``w ||v - u||^2`` with the non-negative weights ``w``
    (the ``reward_weighted`` advantage, ``B softmax(r / T)``)."""
    return LossOutput(inp.advantages * obj.regression_loss(inp.v, inp.target))


register_method(
    Method(
        name="ram",
        paper="RAM: Reinforce Adjoint Matching (catalog 001-01)",
        sampler=Choice("ode"),
        family=Choice("renoise", {"renoise_k": 4}),
        advantage=Choice("grpo", {"eps": 1e-4, "clip": 5.0}),
        loss=ram,
        params=RAMParams,
        needs=frozenset({Input.REF_VELOCITY, Input.SAMPLING_VELOCITY}),
        kl_term=False,  # the KL is the reference in the target (strength m)
    )
)
register_method(
    Method(
        name="awm",
        paper="Advantage-weighted flow matching (AWM baseline)",
        sampler=Choice("ode"),
        family=Choice("renoise", {"renoise_k": 4}),
        advantage=Choice("grpo", {"eps": 1e-4, "clip": 5.0}),
        loss=awm,
    )
)
register_method(
    Method(
        name="rwr",
        paper="Reward-weighted regression (Peters & Schaal 2007) for flow matching",
        sampler=Choice("ode"),
        family=Choice("renoise", {"renoise_k": 4}),
        advantage=Choice("reward_weighted", {"temperature": 0.1}),
        loss=rwr,
    )
)
