"""LLM reward functions (verifiers), and the pool that scores them out of process.

A verifier is a picklable, module-level callable ``fn(completion: str, example) ->
float`` where ``example`` is a :class:`rlpost.llm.data.tasks.Example` (``prompt``,
``answer``, ``meta``). A function written for TRL, ``fn(prompts, completions, **kwargs)
-> list[float | None]`` (the data set's other columns as keyword arguments), works too:
:func:`as_verifier` wraps it (:class:`TRLReward`) so that the pool still scores, and
times out, one completion at a time. :class:`RewardPool` (from :mod:`rlpost.core.pool`, shared with
the diffusion domain) runs them in worker processes with time and memory limits.

:func:`math_verify_reward` (from :mod:`rlpost.llm.data.tasks`, the verifier of files'
"answer" column) checks math answers with ``math-verify``.
"""

from __future__ import annotations

from typing import Any

from rlpost.core.pool import RewardPool, RewardResult, Verifier
from rlpost.llm.data.tasks import math_verify_reward

__all__ = [
    "RewardPool",
    "RewardResult",
    "TRLReward",
    "Verifier",
    "as_verifier",
    "check_reward_signature",
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
        if isinstance(out, (list, tuple)) and len(out) != 1:
            name = getattr(self.fn, "__name__", type(self.fn).__name__)
            raise ValueError(
                f"reward function {name} returned {len(out)} values for 1 completion "
                "(a TRL reward function returns one value per completion)"
            )
        value = out[0] if isinstance(out, (list, tuple)) else out
        return 0.0 if value is None else value


def as_verifier(fn: Any) -> Any:
    """``fn`` as a verifier: TRL-style batched functions wrapped in :class:`TRLReward`."""
    return TRLReward(fn) if _takes_batches(fn) else fn


def check_reward_signature(fn: Any, name: str) -> None:
    """A ``ValueError`` naming ``name`` when ``fn`` cannot be called the way rewards are:
    ``fn(completion, example)``, or TRL's ``fn(prompts=..., completions=..., **columns)``
    (checked before the first rollout, instead of failing on every completion)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # (some builtins have none: cannot tell)
        return
    try:
        if _takes_batches(fn):
            sig.bind_partial(prompts=[], completions=[])
        else:
            sig.bind(None, None)
    except TypeError as exc:
        form = (
            "fn(prompts=..., completions=..., **columns)"
            if _takes_batches(fn)
            else ("fn(completion, example)")
        )
        raise ValueError(
            f"{name}: cannot be called as {form} ({exc}); a reward function takes the "
            "completion and the example (its .prompt, .answer, .meta), or is TRL-style, "
            "fn(prompts, completions, **kwargs) returning one value per completion"
        ) from None
