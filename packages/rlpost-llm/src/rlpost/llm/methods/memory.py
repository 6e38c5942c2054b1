"""Memory for the self-teacher: RESD's reflections and playbook (000-26), PMD's three-level
procedural memory (004-22).

Self-distillation (OPSD, SDPO) gives the policy-as-teacher a privileged context through its
prompt ``template``. These two methods build that context from the run's own experience,
and keep it across steps:

* **reflection** (both): a failed response is turned into a diagnosis of what went wrong.
  ``reflector: feedback`` takes the task's verifier feedback (:meth:`Task.feedback`, e.g.
  ``"57+10"``: 57 is short by tens); ``reflector: policy`` has the policy write it
  (greedy, from ``reflect_template`` over ``{prompt}``, ``{response}``, ``{feedback}``),
  as RESD's model does.
* **playbook** (RESD, ``kind: playbook``): the reusable lesson of every reflection
  (:meth:`Task.lesson`, the problem-specific part removed) goes into a persistent global
  playbook, ranked by how often the run has met it; the top ``show`` lessons are in every
  teacher context, so the self-teacher has corrective supervision even on a prompt with
  no successful rollout.
* **procedural memory** (PMD, ``kind: procedural``), three levels extracted online from
  the policy's own rollouts: raw trajectories (per problem, its verified success if one
  was ever sampled, else its last failed attempt's reflection), lessons (the playbook),
  and behavioural patterns (lessons met on at least two distinct problems, ranked by how
  many). Rollouts update the memory before it conditions the teacher of the same step,
  and the memory shapes the supervision that updates the policy: PMD's co-evolution.

Template fields: ``{reflection}`` (this response's; empty when it succeeded),
``{playbook}``, and for the procedural memory ``{trajectory}``, ``{lessons}``,
``{patterns}``. The memory is checkpointed with the trainer and restored on resume.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from rlpost.llm.data.tasks import Example, Task

FIELDS = {
    "playbook": ("reflection", "playbook"),
    "procedural": ("reflection", "playbook", "trajectory", "lessons", "patterns"),
}


class Playbook:
    """Lessons ranked by how often they were met (ties: the most recent first); at most
    ``capacity`` kept, the least met dropped first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: dict[str, list[int]] = {}  # lesson -> [count, last step]

    def add(self, lesson: str, step: int, times: int = 1) -> None:
        if not lesson:
            return
        e = self.entries.setdefault(lesson, [0, step])
        e[0] += times
        e[1] = step
        while len(self.entries) > self.capacity:
            worst = min(self.entries, key=lambda k: (self.entries[k][0], self.entries[k][1]))
            del self.entries[worst]

    def top(self, k: int) -> list[str]:
        return sorted(self.entries, key=lambda t: (-self.entries[t][0], -self.entries[t][1]))[:k]

    def render(self, k: int) -> str:
        return " ".join(self.top(k))

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "entries": {k: list(v) for k, v in self.entries.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.capacity = int(state["capacity"])
        self.entries = {k: [int(v[0]), int(v[1])] for k, v in state["entries"].items()}


def _key(example: Example) -> str:
    return example.prompt if isinstance(example.prompt, str) else repr(example.prompt)


def task_key(example: Example) -> str:
    """Which task an example belongs to: its mixture domain, else its curriculum stage
    (``"0"``, ``"1"``, ...), else ``""`` (the run's single task)."""
    if "domain" in example.meta:
        return example.meta["domain"]
    return str(example.meta["stage"]) if "stage" in example.meta else ""


class TeacherMemory:
    """The memory of one run (``distill.memory``); see the module docstring.

    ``tasks``: the task of each domain (``""``: the run's single task) for the feedback
    reflector; ``generate(prompts) -> texts``: the policy's greedy reflections (the policy
    reflector)."""

    def __init__(self, cfg, tasks: dict[str, Task], generate=None):
        self.cfg = cfg
        self.kind = cfg.kind
        self.tasks = tasks
        self.generate = generate
        self.playbook = Playbook(cfg.capacity)
        self.patterns: dict[str, list[str]] = {}  # lesson -> distinct problems (capped)
        self.trajectories: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.reflections = 0

    def _task(self, example: Example) -> Task | None:
        return self.tasks.get(task_key(example), self.tasks.get(""))

    def reflect(self, examples: list[Example], texts: list[str]) -> list[str]:
        """A reflection on each response (the caller passes the failed ones)."""
        feedback = []
        for e, t in zip(examples, texts, strict=True):
            task = self._task(e)
            feedback.append(task.feedback(t, e) if task is not None else "")
        if self.cfg.reflector == "feedback":
            return feedback
        assert self.generate is not None, "the policy reflector needs the policy's generate"
        prompts = []
        for e, t, f in zip(examples, texts, feedback, strict=True):
            p = e.prompt if isinstance(e.prompt, str) else repr(e.prompt)
            prompts.append(self.cfg.reflect_template.format(prompt=p, response=t, feedback=f))
        return [re.sub(r"\s+", " ", r).strip() for r in self.generate(prompts)]

    def lesson(self, example: Example, reflection: str) -> str:
        task = self._task(example)
        if task is not None and self.cfg.reflector == "feedback":
            return task.lesson(reflection)
        return re.sub(r"\d+", "0", reflection)  # a written reflection, its numbers masked

    def observe(
        self, examples: list[Example], texts: list[str], correct: list[bool], step: int
    ) -> list[Example]:
        """Update the memory with a step's rollouts (one row each), then return each row's
        example with the memory's template fields in its meta."""
        failed = [i for i, c in enumerate(correct) if not c]
        refl = [""] * len(texts)
        for i, r in zip(
            failed,
            self.reflect([examples[i] for i in failed], [texts[i] for i in failed]),
            strict=True,
        ):
            refl[i] = r
        self.reflections += sum(1 for r in refl if r)
        for i, e in enumerate(examples):
            key = _key(e)
            if correct[i]:
                self._remember(key, success=texts[i])
                continue
            lesson = self.lesson(e, refl[i])
            self.playbook.add(lesson, step)
            if lesson:
                seen = self.patterns.setdefault(lesson, [])
                if key not in seen and len(seen) < 64:
                    seen.append(key)
            if refl[i]:
                self._remember(key, failure=refl[i])
        show = self.cfg.show
        play = self.playbook.render(show)
        recurring = sorted(
            (k for k, v in self.patterns.items() if len(v) >= 2),
            key=lambda k: -len(self.patterns[k]),
        )
        fields_all = {"playbook": play, "lessons": play, "patterns": " ".join(recurring[:show])}
        out = []
        for i, e in enumerate(examples):
            mem = self.trajectories.get(_key(e), {})
            fields = {**fields_all, "reflection": refl[i]}
            fields["trajectory"] = mem.get("success") or mem.get("failure", "")
            keep = FIELDS[self.kind]
            out.append(replace(e, meta={**e.meta, **{k: fields[k] for k in keep}}))
        return out

    def _remember(self, key: str, **what: str) -> None:
        entry = self.trajectories.pop(key, {})
        if "success" in what or "success" not in entry:
            entry.update(what)
        self.trajectories[key] = entry  # most recent last
        while len(self.trajectories) > self.cfg.trajectories:
            self.trajectories.popitem(last=False)

    def metrics(self) -> dict[str, float]:
        solved = sum(1 for v in self.trajectories.values() if "success" in v)
        return {
            "memory/lessons": float(len(self.playbook.entries)),
            "memory/patterns": float(sum(1 for v in self.patterns.values() if len(v) >= 2)),
            "memory/problems": float(len(self.trajectories)),
            "memory/solved_problems": float(solved),
            "memory/reflections": float(self.reflections),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook.state_dict(),
            "patterns": {k: list(v) for k, v in self.patterns.items()},
            "trajectories": [[k, dict(v)] for k, v in self.trajectories.items()],
            "reflections": self.reflections,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.playbook.load_state_dict(state["playbook"])
        self.patterns = {k: list(v) for k, v in state["patterns"].items()}
        self.trajectories = OrderedDict((k, dict(v)) for k, v in state["trajectories"])
        self.reflections = int(state["reflections"])


__all__ = ["FIELDS", "Playbook", "TeacherMemory"]
