"""Text environments for multi-turn agents: a gymnasium-like protocol over text.

An environment is reset with a seed and gives the first observation; the policy answers
with an action (text); the environment returns the next observation, a reward and whether
the episode is over::

    obs = env.reset(seed)                      # str
    res = env.step(action)                     # StepResult(observation, reward, done, info)

Every environment here is deterministic under its seed and has an exact verifier (the
reward is computed, never judged). ``ENVIRONMENTS`` maps names to classes; each takes
its parameters as keyword arguments (``data.env.params``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(Protocol):
    """The protocol (see the module docstring)."""

    name: str

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...


ENVIRONMENTS: dict[str, type] = {}


def register_env(cls: type) -> type:
    ENVIRONMENTS[cls.name] = cls
    return cls


def encode_observation(tokenizer, text: str) -> list[int]:
    """An observation's ids, appended after the sequence so far (no special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def hint_text(actions: list[str]) -> str:
    """A hindsight hint: a solution's actions, space-separated, then ``:`` (what a teacher
    context puts before the first observation, e.g. StepOPSD's)."""
    return " ".join(actions) + ":"


def play(env: TextEnv, actions: list[str]) -> list[StepResult]:
    """Step ``env`` through scripted ``actions`` until the episode ends (after a
    ``reset``): each step's result (for testing an environment or a demonstration)."""
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1].done:
            break
    return out


def make_env(name: str, **params: Any) -> TextEnv:
    """A new environment ``name`` with ``params`` (a one-line error for a wrong name)."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; valid: {', '.join(sorted(ENVIRONMENTS))}")
    return ENVIRONMENTS[name](**params)


__all__ = [
    "ENVIRONMENTS",
    "StepResult",
    "TextEnv",
    "encode_observation",
    "hint_text",
    "make_env",
    "play",
    "register_env",
]
