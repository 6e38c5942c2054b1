"""Step hooks, one module each (see :mod:`.base`): ``mipu`` (MIPU's acceptance),
``validation_reset`` (REVA-PO's VAPR), ``kv_distill`` (the compressed-KV distillation
term), ``regularizer`` (a gradient regulariser), ``peer_exchange`` (Mutual RL), ``traces`` (the
rollout traces, ``run.traces``), ``verifier_noise`` (``reward.noise``'s generator), ``flops`` (RACE's FLOP accounting,
``run.flops``), ``rac`` (RAC's confidence losses, ``algo.rac``), ``vigor`` (VIGOR's intrinsic
reward, ``algo.vigor``), ``astor_kl`` (ASTOR's per-task KL),
``transfer_eval`` (``data.transfer``'s held-out accuracy)."""

from rlpost.llm.train.hooks import (  # noqa: F401  (each module registers its hook)
    astor_kl,
    exchange,
    flops,
    kv_distill,
    mipu,
    rac,
    regularizer,
    traces,
    transfer,
    vapr,
    verifier_noise,
    vigor,
)
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook, active, apply_options


def switched_on(cfg, preset) -> list[type[StepHook]]:
    return [h for h in STEP_HOOKS.values() if h.on(cfg, preset)]


def parties(cfg, preset, recipe):
    """The hooks the config switches on, as parties."""
    return [h.party() for h in switched_on(cfg, preset)]


def check(cfg, preset, recipe) -> None:
    """Each hook's own checks of a config that switches it on."""
    for h in switched_on(cfg, preset):
        h.check(cfg, preset, recipe)


__all__ = ["STEP_HOOKS", "StepHook", "active", "apply_options", "check", "switched_on"]
