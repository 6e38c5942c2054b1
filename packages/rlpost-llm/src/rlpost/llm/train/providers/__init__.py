"""Input providers, one module each (see :mod:`.base`): ``batch`` (the rollout's own
tensors), ``vector_rewards``, ``behaviour`` (pi_old, token distributions), ``reference``,
``critic``, ``dynamics``, ``features``, ``teachers``, ``turns``, ``token_weights``
(attention entropy) and the regulariser's gradient inputs (``gradients``)."""

from rlpost.llm.train.providers import (  # noqa: F401  (each module registers its provider)
    attention,
    batch,
    behaviour,
    critic,
    dynamics,
    features,
    gradients,
    reference,
    rewards,
    teachers,
    turns,
)
from rlpost.llm.train.providers.base import (
    INPUT_PROVIDERS,
    InputProvider,
    active,
    hints,
    provided_inputs,
    step_reads,
)


def wanted(cfg, recipe) -> list[type[InputProvider]]:
    """The providers a run of ``cfg`` computes."""
    reads = step_reads(cfg, recipe)
    return [
        p for p in INPUT_PROVIDERS.values() if p.available(cfg) and p.wanted(cfg, recipe, reads)
    ]


def parties(cfg, preset, recipe):
    """The providers a run of the config computes, as parties."""
    return [p.party() for p in wanted(cfg, recipe)]


def check(cfg, preset, recipe) -> None:
    """Each provider's own checks of the config."""
    for p in INPUT_PROVIDERS.values():
        p.check(cfg, preset, recipe)


__all__ = [
    "INPUT_PROVIDERS",
    "InputProvider",
    "active",
    "check",
    "hints",
    "provided_inputs",
    "step_reads",
    "wanted",
]
