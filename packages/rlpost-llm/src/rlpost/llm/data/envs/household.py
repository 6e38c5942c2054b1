"""A household text world in the style of ALFWorld: find objects, heat or clean them, put
them in place. Deterministic under its seed, with an exact verifier.

The house has ordinary places ``1``-``6``, a microwave ``7`` and a sink ``8``. Four of the
ten objects (digits ``0``-``9``) lie in the ordinary places; the agent sees a place's
objects only when it goes there. Each episode has one goal (kinds as ALFWorld's):

* ``pick``: put object ``o`` in place ``r`` (goal text ``"o=r"``);
* ``heat``: heat ``o`` in the microwave, then put it in ``r`` (``"*o=r"``);
* ``clean``: clean ``o`` in the sink, then put it in ``r`` (``"-o=r"``);
* ``picktwo``: put ``o`` and ``p`` both in ``r`` (``"op=r"``).

Actions, one per turn (the character tokenizer's alphabet has no letters): a digit ``L``
goes to place ``L``; ``+o`` takes object ``o`` from here (hands empty); ``*`` heats the
held object (at the microwave); ``-`` cleans it (at the sink); ``=`` puts it down here.
Observations: after going somewhere, the objects there (sorted) then ``>``; after any
other valid action ``>``; after an invalid one ``()>`` (the state is unchanged). The first
observation is the goal text then ``>``.

The world has a regularity a policy can learn: each object has a home place
(``1 + o % 6``) where it lies with probability ``prior``. The scripted demonstrations
(:meth:`HouseholdEnv.demonstrate`, which a tiny base is supervised on) search the places
in a random order, so under a tight ``budget`` (turns) a policy that looks at an object's
home first succeeds more often than its base: that is the improvement RL can find.

The reward is 1 when the goal holds (the episode then ends), else 0 at the budget.
``info`` records the validity of each step, the goal's kind, and ``gain``: the number of
the goal's sub-steps (find, take, heat/clean, put, per object) completed by the turn
(a per-turn progress signal; A²TGPO's turn signal where no ground-truth answer exists).
"""

from __future__ import annotations

import random
from typing import Any

from rlpost.llm.data.envs.base import StepResult, register_env
from rlpost.llm.data.tasks import extract_answer

PLACES = range(1, 7)
MICROWAVE, SINK = 7, 8
KINDS = ("pick", "heat", "clean", "picktwo")


@register_env
class HouseholdEnv:
    """See the module docstring. ``kinds``: the goal kinds drawn from; ``objects``: how many
    objects lie in the house; ``prior``: the probability an object lies at its home;
    ``budget``: turns per episode (default 20, enough for any search)."""

    name = "household"
    positions = 128  # the env base's context (a hinted demonstration fits in ~90 tokens)
    hints = 0.5  # the share of hinted SFT episodes (rlpost.llm.data.envs.pretrain)

    def __init__(
        self,
        kinds: list[str] | tuple[str, ...] = KINDS,
        objects: int = 4,
        prior: float = 0.7,
        budget: int | None = None,
    ):
        bad = [k for k in kinds if k not in KINDS]
        if not kinds or bad:
            raise ValueError(f"household: kinds must be among {', '.join(KINDS)}, got {kinds}")
        if not 2 <= objects <= 10:
            raise ValueError(f"household: objects must be in 2..10, got {objects}")
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"household: prior must be in [0, 1], got {prior}")
        if budget is not None and budget < 1:
            raise ValueError(f"household: budget must be >= 1, got {budget}")
        self.kinds, self.n_objects, self.prior = tuple(kinds), objects, prior
        self.budget = budget if budget is not None else 20
        self.seed = 0

    @staticmethod
    def home(obj: int) -> int:
        return 1 + obj % 6

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int) -> str:
        rng = random.Random(f"household-{seed}")
        self.seed = seed
        self.kind = rng.choice(self.kinds)
        objs = rng.sample(range(10), self.n_objects)
        self.where: dict[int, int] = {}
        for o in objs:
            if rng.random() < self.prior:
                self.where[o] = self.home(o)
            else:
                self.where[o] = rng.choice([p for p in PLACES if p != self.home(o)])
        n = 2 if self.kind == "picktwo" else 1
        self.targets = objs[:n]
        self.start = dict(self.where)
        away = [p for p in PLACES if all(self.where[o] != p for o in self.targets)]
        self.goal_place = rng.choice(away or list(PLACES))
        self.at = 0  # the doorway: no place yet
        self.held: int | None = None
        self.hot: set[int] = set()
        self.clean: set[int] = set()
        self.turns = 0
        self.seen: set[int] = set()
        self.progress = 0
        return f"{self.goal()}>"

    def goal(self) -> str:
        prefix = {"heat": "*", "clean": "-"}.get(self.kind, "")
        return f"{prefix}{''.join(map(str, self.targets))}={self.goal_place}"

    def solved(self) -> bool:
        ok = all(self.where.get(o) == self.goal_place for o in self.targets)
        if self.kind == "heat":
            ok = ok and self.targets[0] in self.hot
        if self.kind == "clean":
            ok = ok and self.targets[0] in self.clean
        return ok

    def _progress(self) -> int:
        """Sub-steps of the goal done: per target, found (seen), taken or placed, treated
        (heat / clean goals), placed."""
        done = 0
        for o in self.targets:
            placed = self.where.get(o) == self.goal_place and self.held != o
            done += o in self.seen
            done += self.held == o or placed
            if self.kind in ("heat", "clean"):
                done += o in (self.hot if self.kind == "heat" else self.clean)
            done += placed
        return done

    def _act(self, action: str) -> str | None:
        """Apply ``action``; the observation, or ``None`` when it is invalid."""
        if len(action) == 1 and action.isdigit() and 1 <= int(action) <= SINK:
            self.at = int(action)
            here = sorted(o for o, p in self.where.items() if p == self.at)
            self.seen.update(here)
            return "".join(map(str, here)) + ">"
        if len(action) == 2 and action[0] == "+" and action[1].isdigit():
            o = int(action[1])
            if self.held is None and self.where.get(o) == self.at:
                self.held = o
                del self.where[o]
                return ">"
            return None
        if action == "*" and self.held is not None and self.at == MICROWAVE:
            self.hot.add(self.held)
            return ">"
        if action == "-" and self.held is not None and self.at == SINK:
            self.clean.add(self.held)
            return ">"
        if action == "=" and self.held is not None and self.at in PLACES:
            self.where[self.held] = self.at
            self.held = None
            return ">"
        return None

    def step(self, action: str) -> StepResult:
        self.turns += 1
        obs = self._act(extract_answer(action))
        before, self.progress = self.progress, self._progress()
        info: dict[str, Any] = {
            "valid": obs is not None,
            "turn": self.turns,
            "kind": self.kind,
            "gain": float(self.progress - before),
        }
        solved = self.solved()
        if solved or self.turns >= self.budget:
            return StepResult("", 1.0 if solved else 0.0, True, {**info, "solved": solved})
        return StepResult(obs if obs is not None else "()>", 0.0, False, info)

    # ------------------------------------------------------------------ scripted
    def demonstrate(self) -> list[str]:
        """A scripted solution from the episode's start, searching places in a random
        order (seeded by the episode) and remembering what it saw."""
        rng = random.Random(f"household-demo-{self.seed}")
        order = list(PLACES)
        rng.shuffle(order)
        where = dict(self.start)
        known: dict[int, int] = {}
        visited: set[int] = set()
        out: list[str] = []
        cur = 0
        for o in self.targets:
            while o not in known:
                cur = next(q for q in order if q not in visited)
                visited.add(cur)
                out.append(str(cur))
                known.update({x: q for x, q in where.items() if q == cur})
            if cur != known[o]:
                cur = known[o]
                out.append(str(cur))
            out.append(f"+{o}")
            del where[o]
            if self.kind in ("heat", "clean"):
                cur = MICROWAVE if self.kind == "heat" else SINK
                out += [str(cur), "*" if self.kind == "heat" else "-"]
            cur = self.goal_place
            out += [str(cur), "="]
            where[o] = known[o] = cur
        return out


__all__ = ["KINDS", "HouseholdEnv"]
