"""LLM reward functions (verifiers), and the pool that scores them out of process.

A verifier is a picklable, module-level callable ``fn(completion: str, example) ->
float`` where ``example`` is a :class:`rlpost.llm.tasks.Example` (``prompt``,
``answer``, ``meta``). :class:`RewardPool` (from :mod:`rlpost.core.pool`, shared with
the diffusion domain) runs them in worker processes with time and memory limits.

:func:`math_verify_reward` checks math answers with ``math-verify``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlpost.core.pool import RewardPool, RewardResult, Verifier

if TYPE_CHECKING:
    from rlpost.llm.tasks import Example

__all__ = ["RewardPool", "RewardResult", "Verifier", "math_verify_reward"]


def math_verify_reward(completion: str, example: Example) -> float:
    """1.0 iff ``math_verify.verify(parse(example.answer), parse(completion))`` holds, else 0.0.

    math-verify's own ``signal.alarm`` time limits are disabled (they only work in
    a process's main thread and would raise in threaded callers); run this in a
    :class:`RewardPool` with ``workers > 0``, which enforces the time limit by
    killing the worker.  Unparseable completions score 0 (they are wrong
    answers, not errors).
    """
    from math_verify import parse, verify

    gold = parse(example.answer, parsing_timeout=None)  # type: ignore[arg-type]
    pred = parse(completion, parsing_timeout=None)  # type: ignore[arg-type]
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def _math_verify_warmup() -> None:
    """Import math-verify (and sympy) once per worker and silence its 'timeout disabled' note."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    verify(parse("1", parsing_timeout=None), parse("1", parsing_timeout=None), timeout_seconds=None)  # type: ignore[arg-type]


math_verify_reward.warmup = _math_verify_warmup  # type: ignore[attr-defined]
