"""LLM reward functions (verifiers), and the pool that scores them out of process.

A verifier is a picklable, module-level callable ``fn(completion: str, example) ->
float`` where ``example`` is a :class:`rlpost.llm.data.tasks.Example` (``prompt``,
``answer``, ``meta``). A function written for TRL, ``fn(prompts, completions, **kwargs)
-> list[float | None]`` (the data set's other columns as keyword arguments), works too:
:func:`as_verifier` wraps it (:class:`TRLReward`) so that the pool still scores, and
times out, one completion at a time. :class:`RewardPool` (from :mod:`rlpost.core.pool`, shared with
the diffusion domain) runs them in worker processes with time and memory limits.

:func:`math_verify_reward` checks math answers with ``math-verify``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlpost.core.pool import RewardPool, RewardResult, Verifier

if TYPE_CHECKING:
    from rlpost.llm.data.tasks import Example

__all__ = [
    "RewardPool",
    "RewardResult",
    "TRLReward",
    "Verifier",
    "as_verifier",
    "math_verify_reward",
]


def _takes_batches(fn: Any) -> bool:
    """A TRL-style reward function: it has a ``completions`` parameter."""
    import inspect

    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class TRLReward:
    """A TRL reward function ``fn(prompts, completions, **kwargs) -> list[float | None]``
    as a verifier ``(completion, example) -> float``: called with batches of one (the
    example's ``meta`` columns, and ``answer``, as keyword arguments; conversational
    prompts get the completion as ``[{"role": "assistant", "content": ...}]``, as in TRL).
    ``None`` ("does not apply to this sample") scores 0."""

    def __init__(self, fn: Any):
        import inspect

        self.fn = fn
        params = inspect.signature(fn).parameters.values()
        self._any_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
        self._names = {p.name for p in params}
        if callable(getattr(fn, "warmup", None)):
            self.warmup = fn.warmup

    def __call__(self, completion: str, example: Any) -> float:
        from rlpost.llm.data.tasks import is_conversational

        columns = {"answer": example.answer, **example.meta}
        kwargs = {k: [v] for k, v in columns.items() if self._any_kwargs or k in self._names}
        done: Any = completion
        if is_conversational(example.prompt):
            done = [{"role": "assistant", "content": completion}]
        out = self.fn(prompts=[example.prompt], completions=[done], **kwargs)
        value = out[0] if isinstance(out, (list, tuple)) else out
        return 0.0 if value is None else value


def as_verifier(fn: Any) -> Any:
    """``fn`` as a verifier: TRL-style batched functions wrapped in :class:`TRLReward`."""
    return TRLReward(fn) if _takes_batches(fn) else fn


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
