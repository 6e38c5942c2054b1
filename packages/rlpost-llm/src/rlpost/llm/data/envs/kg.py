"""A synthetic knowledge-graph reasoning environment (catalog 000-04): each instance varies
along depth, complexity and one of four reasoning families. Deterministic under its seed,
with an exact verifier.

Entities are the digits ``0``-``9`` and relations ``+``, ``*``, ``-``. A fact ``"3+5"``
says entity 3 relates to 5 by ``+``. An instance shows a list of facts, then a question;
the policy answers with one entity (one turn; reward 1 when right).

* **deductive** (forward state tracking): ``"... :3+*>"``, follow ``+`` then ``*`` from 3;
* **abductive** (recover a hidden fact): ``"... :3+(*)7>"``, the entity between 3 and 7
  on that path, whose facts are shown but whose start is not;
* **inductive** (rule induction): the facts of one relation follow a rule, ``x -> x + c
  mod 10``; ``"... :4+>"`` asks for the rule's value on an entity no fact shows;
* **analogical** (transfer): ``"... :3=5(6)>"``, the relation that takes 3 to 5 (read
  from the facts), applied to 6.

``depth``: the path length of deductive questions, and the number of rule examples
beyond two of inductive ones (1-3). ``complexity``: the number of distractor facts, facts
on other paths that share entities with the asked one (so a policy must pick the right
path among interacting structures). Either may be a list of levels, a region of the grid
that each instance draws its cell from (the coverage study's pre- and post-training
distributions); ``info`` records the instance's ``family``, ``depth`` and
``complexity``. ``families``: which families are drawn from. Every instance is checked solvable and unique by a brute-force
solver (:func:`solve`) independent of how it was generated.
"""

from __future__ import annotations

import random
from typing import Any

from rlpost.llm.data.envs.base import StepResult, register_env
from rlpost.llm.data.tasks import extract_answer

FAMILIES = ("deductive", "abductive", "inductive", "analogical")
RELATIONS = "+*-"


def parse(prompt: str) -> tuple[dict[tuple[int, str], int], str]:
    """The facts ``{(subject, relation): object}`` and the question of an instance."""
    body, _, question = prompt.rstrip(">").rpartition(":")
    facts = {}
    for f in body.split():
        facts[(int(f[0]), f[1])] = int(f[2])
    return facts, question


def _follow(facts: dict, start: int, rels: str) -> int | None:
    e = start
    for r in rels:
        if (e, r) not in facts:
            return None
        e = facts[(e, r)]
    return e


def solve(prompt: str, family: str) -> list[int]:
    """Every answer consistent with the instance, by brute force over the 10 entities."""
    facts, q = parse(prompt)
    if family == "deductive":
        end = _follow(facts, int(q[0]), q[1:])
        return [end] if end is not None else []
    if family == "abductive":  # "3+(*)7": the hidden x of 3+x (not shown) with x*7 shown
        start, r1, r2, end = int(q[0]), q[1], q[3], int(q[5])
        if (start, r1) in facts:
            return []
        return [x for x in range(10) if x not in (start, end) and facts.get((x, r2)) == end]
    if family == "inductive":
        e, r = int(q[0]), q[1]
        shifts = {(o - s) % 10 for (s, rr), o in facts.items() if rr == r}
        return [(e + shifts.pop()) % 10] if len(shifts) == 1 else []
    if family == "analogical":  # "3=5(6)"
        a, b, c = int(q[0]), int(q[2]), int(q[4])
        rels = [r for r in RELATIONS if facts.get((a, r)) == b]
        outs = {facts.get((c, r)) for r in rels}
        return sorted(o for o in outs if o is not None)
    raise ValueError(f"unknown family {family!r}")


def _levels(name: str, value: int | list[int], lo: int, hi: int) -> tuple[int, ...]:
    """One level or a list of them (drawn per instance), each in ``lo..hi``."""
    levels = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not levels or any(not isinstance(v, int) or not lo <= v <= hi for v in levels):
        raise ValueError(f"kg: {name} must be in {lo}..{hi} (or a list of such), got {value}")
    return levels


@register_env
class KGEnv:
    """See the module docstring."""

    name = "kg"

    def __init__(
        self,
        depth: int | list[int] = 2,
        complexity: int | list[int] = 3,
        families: list[str] | tuple[str, ...] = FAMILIES,
    ):
        self.depths = _levels("depth", depth, 1, 3)
        self.complexities = _levels("complexity", complexity, 0, 6)
        bad = [f for f in families if f not in FAMILIES]
        if not families or bad:
            raise ValueError(f"kg: families must be among {', '.join(FAMILIES)}, got {families}")
        self.families = tuple(families)
        self.depth, self.complexity = self.depths[0], self.complexities[0]
        self.answer_value = 0
        self.family = self.families[0]

    def reset(self, seed: int) -> str:
        rng = random.Random(f"kg-{seed}")
        self.family = rng.choice(self.families)
        # a region of the (depth, complexity) grid: each instance draws its cell (a single
        # level draws nothing, so fixed-level instances are what they always were)
        if len(self.depths) > 1:
            self.depth = rng.choice(self.depths)
        if len(self.complexities) > 1:
            self.complexity = rng.choice(self.complexities)
        for _ in range(1000):
            prompt, answer = getattr(self, f"_{self.family}")(rng)
            if solve(prompt, self.family) == [answer]:
                break
        else:  # pragma: no cover - the generators are built to succeed
            raise RuntimeError("kg: could not draw a unique instance")
        self.prompt, self.answer_value = prompt, answer
        return prompt

    def ground_truth(self) -> str:
        return str(self.answer_value)

    def demonstrate(self) -> list[str]:
        return [self.ground_truth()]

    def step(self, action: str) -> StepResult:
        said = extract_answer(action)
        right = said == str(self.answer_value)
        info: dict[str, Any] = {"valid": said.isdigit(), "family": self.family, "solved": right}
        info |= {"depth": self.depth, "complexity": self.complexity}
        info["gain"] = 1.0 if right else 0.0
        return StepResult("", 1.0 if right else 0.0, True, info)

    # ------------------------------------------------------------------ generators
    def _distract(self, rng: random.Random, facts: dict, near: list[int]) -> None:
        """Add ``complexity`` facts whose subject is an entity of the asked structure (or
        a random one when those are full), never overwriting a fact."""
        added, tries = 0, 0
        while added < self.complexity and tries < 200:
            tries += 1
            s = rng.choice(near) if rng.random() < 0.7 else rng.randrange(10)
            r = rng.choice(RELATIONS)
            if (s, r) not in facts:
                facts[(s, r)] = rng.randrange(10)
                added += 1

    @staticmethod
    def _text(facts: dict, rng: random.Random, question: str) -> str:
        items = [f"{s}{r}{o}" for (s, r), o in facts.items()]
        rng.shuffle(items)
        return " ".join(items) + f":{question}>"

    def _path(self, rng: random.Random, n: int) -> tuple[list[int], str]:
        ents = rng.sample(range(10), n + 1)
        return ents, "".join(rng.choice(RELATIONS) for _ in range(n))

    def _deductive(self, rng: random.Random) -> tuple[str, int]:
        ents, rels = self._path(rng, self.depth)
        facts = {(ents[i], r): ents[i + 1] for i, r in enumerate(rels)}
        self._distract(rng, facts, ents)
        return self._text(facts, rng, f"{ents[0]}{rels}"), ents[-1]

    def _abductive(self, rng: random.Random) -> tuple[str, int]:
        ents, rels = self._path(rng, 2)  # start -r1-> hidden -r2-> end; the first fact hidden
        start, mid, end = ents
        facts = {(mid, rels[1]): end}
        self._distract(rng, facts, ents)
        facts.pop((start, rels[0]), None)  # the hidden event: never shown
        return self._text(facts, rng, f"{start}{rels[0]}({rels[1]}){end}"), mid

    def _inductive(self, rng: random.Random) -> tuple[str, int]:
        r, c = rng.choice(RELATIONS), rng.randrange(1, 10)
        shown = rng.sample(range(10), 2 + self.depth)
        asked = rng.choice([e for e in range(10) if e not in shown])
        facts = {(s, r): (s + c) % 10 for s in shown}
        others = [x for x in RELATIONS if x != r]
        added = 0
        while added < self.complexity:
            s, rr = rng.randrange(10), rng.choice(others)
            if (s, rr) not in facts:
                facts[(s, rr)] = rng.randrange(10)
                added += 1
        return self._text(facts, rng, f"{asked}{r}"), (asked + c) % 10

    def _analogical(self, rng: random.Random) -> tuple[str, int]:
        r = rng.choice(RELATIONS)
        a, b, c, d = rng.sample(range(10), 4)
        facts = {(a, r): b, (c, r): d}
        self._distract(rng, facts, [a, c])
        facts[(a, r)], facts[(c, r)] = b, d
        return self._text(facts, rng, f"{a}={b}({c})"), d


__all__ = ["FAMILIES", "KGEnv", "parse", "solve"]
