"""The GRPO-family presets the LLM trainer accepts (defined in :mod:`rlpost.core.presets`)."""

from rlpost.core.presets import PRESETS, Preset, get_preset

__all__ = ["PRESETS", "Preset", "get_preset"]
