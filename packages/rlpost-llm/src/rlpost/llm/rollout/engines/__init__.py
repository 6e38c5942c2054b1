"""Rollout engines: the protocol, the lean decode loop, the HF ``generate`` engine, and the
vLLM engine (lazy)."""

from rlpost.llm.rollout.engines.base import RolloutBatch, RolloutEngine, SamplingParams
from rlpost.llm.rollout.engines.hf import HFEngine
from rlpost.llm.rollout.engines.lean import LeanEngine, lean_unsupported

__all__ = [
    "HFEngine",
    "LeanEngine",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingParams",
    "lean_unsupported",
    "make_local_engine",
    "make_vllm_engine",
]


def make_local_engine(
    name: str, model, tokenizer, own_copy: bool = False, decode: str = "auto"
) -> RolloutEngine:
    """The in-process engine ``name`` (``lean``, ``hf``, or ``auto``: lean when
    :func:`lean_unsupported` accepts the model, else hf) over ``model``; ``decode``: the
    lean engine's decode step (:class:`LeanEngine`)."""
    if name == "lean" or (name == "auto" and lean_unsupported(model) is None):
        return LeanEngine(model, tokenizer, own_copy=own_copy, decode=decode)
    if name not in ("auto", "hf"):
        raise ValueError(f"not an in-process engine: {name!r}")
    return HFEngine(model, tokenizer, own_copy=own_copy)


def make_vllm_engine(*args, **kwargs):
    """Build the vLLM engine (extra ``[vllm]``, GPU only); clear error when vLLM is absent."""
    from rlpost.llm.rollout.engines.vllm import VLLMEngine  # imports vllm lazily inside

    return VLLMEngine(*args, **kwargs)
