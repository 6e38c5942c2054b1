"""Corrupted inputs for the built-in tasks (RAC's clean/corrupted confidence pairs, 000-19):
the prompt with some of its digits masked, so that the evidence an answer rests on is
degraded while the prompt keeps its shape."""

from __future__ import annotations

import random
from typing import Any


def mask_digits(text: str, rate: float, rng: random.Random, mask: str = " ") -> str:
    """``text`` with each digit replaced by ``mask`` with probability ``rate`` (at least one
    digit when it has any and ``rate > 0``, so a corrupted prompt always differs)."""
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    if not digits or rate <= 0:
        return text
    hit = {i for i in digits if rng.random() < rate} or {rng.choice(digits)}
    return "".join(mask if i in hit else c for i, c in enumerate(text))


def corrupt_prompt(prompt: Any, rate: float, rng: random.Random, mask: str = " ") -> Any:
    """A text prompt with digits masked, or a conversation with its user turns' digits
    masked."""
    if isinstance(prompt, str):
        return mask_digits(prompt, rate, rng, mask)
    return [
        {**m, "content": mask_digits(m["content"], rate, rng, mask)} if m["role"] == "user" else m
        for m in prompt
    ]
