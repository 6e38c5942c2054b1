"""Rollout engines: the protocol, the HF ``generate`` engine, and the vLLM engine (lazy)."""

from rlpost.llm.engines.base import RolloutBatch, RolloutEngine, SamplingParams
from rlpost.llm.engines.hf import HFEngine

__all__ = ["HFEngine", "RolloutBatch", "RolloutEngine", "SamplingParams", "make_vllm_engine"]


def make_vllm_engine(*args, **kwargs):
    """Build the vLLM engine (extra ``[vllm]``, GPU only); clear error when vLLM is absent."""
    from rlpost.llm.engines.vllm import VLLMEngine  # imports vllm lazily inside

    return VLLMEngine(*args, **kwargs)
