"""A symbol-rewrite environment (catalog 004-13), multi-turn and fully auditable.

The state is a string of digits. One primitive rewrite contracts two adjacent symbols
``a b`` into ``(a + b) mod 10``; the episode is solved when one symbol is left. Each turn
the policy writes the whole next string, which the environment audits: it is valid when it
comes from the current string by contracting runs of adjacent symbols, each run into the
sum of its symbols mod 10 (a run of 2 is a primitive contraction, a longer run a
*sequential* composition, several runs in one step a *parallel* one), with at least one
contraction. A valid rewrite becomes the state; an invalid one leaves it unchanged. The
system is confluent (every valid step keeps the sum mod 10), so a single remaining symbol
is always the right answer: the reward is 1 when the string is reduced to one symbol
within the turn budget, else 0 (a binary final-answer reward).

Transcript: the first observation is ``"<digits>>"``; each action is the next string
(ended by the model's EOS); after a valid rewrite the observation is ``">"``, after an
invalid one ``"()<state>>"``. ``budget`` (default: ``length - 1`` turns, enough for
primitive contractions only) caps the turns: a smaller budget needs composed rewrites.
``info`` audits every step: valid, the run lengths, primitive / composed contractions.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from rlpost.llm.data.envs.base import StepResult, register_env
from rlpost.llm.data.tasks import extract_answer


def audit(old: str, new: str, k: int = 10) -> list[int] | None:
    """The run lengths by which ``new`` comes from ``old`` (each run of ``old`` replaced by
    its digit sum mod ``k``), or ``None`` when it does not (or contracts nothing)."""
    if not new or not new.isdigit() or len(new) >= len(old):
        return None
    digits = [int(c) for c in old]

    @cache
    def walk(i: int, j: int) -> tuple[int, ...] | None:
        if i == len(digits) and j == len(new):
            return ()
        if i == len(digits) or j == len(new):
            return None
        total = 0
        for end in range(i, len(digits) - (len(new) - j - 1)):
            total = (total + digits[end]) % k
            if total == int(new[j]):
                rest = walk(end + 1, j + 1)
                if rest is not None:
                    return (end + 1 - i, *rest)
        return None

    runs = walk(0, 0)
    return list(runs) if runs is not None else None


@register_env
class RewriteEnv:
    """See the module docstring. ``min_len`` / ``max_len``: the start string's length."""

    name = "rewrite"

    def __init__(self, min_len: int = 3, max_len: int = 5, budget: int | None = None):
        if not 2 <= min_len <= max_len:
            raise ValueError(f"rewrite: need 2 <= min_len <= max_len, got {min_len}, {max_len}")
        if budget is not None and budget < 1:
            raise ValueError(f"rewrite: budget must be >= 1, got {budget}")
        self.min_len, self.max_len, self.budget = min_len, max_len, budget
        self.state = ""
        self.turns = 0
        self.limit = 0

    def reset(self, seed: int) -> str:
        rng = random.Random(f"rewrite-{seed}")
        n = rng.randint(self.min_len, self.max_len)
        self.state = "".join(str(rng.randint(0, 9)) for _ in range(n))
        self.start = self.state
        self.turns = 0
        self.limit = self.budget if self.budget is not None else n - 1
        return f"{self.state}>"

    def demonstrate(self) -> list[str]:
        """A scripted solution from the start string: primitive contractions of the
        leftmost pair, one per turn (the "primitive rewrite chains" a base is pretrained
        on; they need ``length - 1`` turns)."""
        out, state = [], self.start
        while len(state) > 1:
            state = str((int(state[0]) + int(state[1])) % 10) + state[2:]
            out.append(state)
        return out

    def answer(self) -> str:
        """The normal form of the start string (its digit sum mod 10)."""
        return str(sum(int(c) for c in self.start) % 10)

    def step(self, action: str) -> StepResult:
        self.turns += 1
        new = extract_answer(action)
        runs = audit(self.state, new)
        info: dict[str, Any] = {"valid": runs is not None, "turn": self.turns}
        if runs is not None:
            self.state = new
            info["runs"] = runs
            info["primitive"] = sum(1 for r in runs if r == 2)
            info["composed"] = sum(1 for r in runs if r > 2) + (sum(r > 1 for r in runs) > 1)
        solved = len(self.state) == 1
        done = solved or self.turns >= self.limit
        if done:
            return StepResult("", 1.0 if solved else 0.0, True, {**info, "solved": solved})
        obs = ">" if runs is not None else f"(){self.state}>"
        return StepResult(obs, 0.0, False, info)


__all__ = ["RewriteEnv", "audit"]
