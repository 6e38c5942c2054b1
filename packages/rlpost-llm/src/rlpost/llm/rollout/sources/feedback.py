"""FBOS-RL's guided re-rollouts (000-15) and RubricEM's reflection meta-policy (000-30).

A plain round of ``G - m`` rollouts per prompt, then a second round of ``m`` conditioned
on a diagnosed failure (the plain prompt where there is none), assembled into EPA's and
ECC's rows (:mod:`rlpost.llm.rollout.feedback`). With the policy as reflector each
guided rollout reads a reflection the policy wrote on the prompt's first failure; under
``meta`` the reflections join the batch, a group per failure, rewarded by the attempts
they guided; with a ``bank`` the reflections that guided a verified attempt are kept
across steps (checkpointed) and offered to later attempts as ``{guidance}``. The
settings are :class:`rlpost.core.feedback.FeedbackExploration`'s (``algo.feedback``
merges over the preset's).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rlpost.core.contract import Declares, Property
from rlpost.core.feedback import FeedbackExploration, rescued
from rlpost.core.peers import TRAIN
from rlpost.core.presets import Choice
from rlpost.llm.data.prompts import encode_prompt
from rlpost.llm.data.tasks import Example
from rlpost.llm.methods.memory import Playbook
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.feedback import assemble, first_failures, guided_contexts
from rlpost.llm.rollout.sources.base import GENERATE, RolloutSource, register_source
from rlpost.llm.rollout.sources.groups import generate


@register_source
class FeedbackSource(RolloutSource):
    """Two rounds a step: plain, then guided by the failures' feedback."""

    name = "feedback"
    layer = GENERATE
    params = FeedbackExploration
    option = "feedback"
    example = ("algo.preset=fbos",)
    label = "preset {preset.name!r}'s feedback rounds"
    declares = Declares(
        requires={
            Property.SINGLE_TURN: "re-roll single-turn prompts (multi-turn episodes get "
            "their feedback as observations)",
            Property.ONE_ROUND: "rescue all-equal groups with their own guided round",
            Property.PER_STEP: "guide each step's own failures",
            Property.ONE_POLICY: "guide one policy's failures",
            Property.VERIFIER_FEEDBACK: "need a built-in task's verifier feedback",
        },
        breaks={
            Property.GROUPS_ON_DEMAND: "generate a fixed two-round step",
            Property.EVEN_GROUPS: "make groups uneven (EPA copies)",
        },
    )

    state_key = "guidance_bank"

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.bank = Playbook(max(1, self.params.bank))  # (used when params.bank > 0)

    @classmethod
    def from_option(cls, value: dict, current: Choice | None) -> Choice:
        if current is None:
            raise ValueError(
                "algo.feedback: the preset has no feedback-guided round (use fbos, "
                "fbos_epa, fbos_ecc or rubricem_reflect)"
            )
        return Choice(cls.name, {**current.params, **value})

    @classmethod
    def check_preset(cls, preset: Any, params: FeedbackExploration) -> None:
        try:
            params.split(preset.group_size)
        except ValueError as exc:
            raise ValueError(f"preset {preset.name!r}: {exc}") from None

    @classmethod
    def rows_per_group(cls, params: FeedbackExploration, group_size: int) -> int:
        m = params.split(group_size)[1]
        return group_size + m * (2 if params.meta else 1)  # EPA copies (and reflections)

    def _task_of(self, e: Example):
        """The verifier of ``e``'s domain (a mixture's), else the run's task."""
        prompts = self.trainer.prompts
        tasks = getattr(prompts, "tasks", None)
        if isinstance(tasks, dict):
            return tasks.get(e.meta.get("domain"))
        return prompts.task

    def _feedback(self, text: str, e: Example) -> str:
        task = self._task_of(e)
        return task.feedback(text, e) if task is not None else ""

    def _guided_round(self, fb, examples, prompts, texts, correct, m):
        """The verifier's diagnoses as guidance: ``(guided [P], second [P * m], scored)``."""
        t = self.trainer
        ctx = guided_contexts(fb, examples, texts, correct, self._feedback)
        guided = torch.tensor([c is not None for c in ctx])
        second_prompts = [
            encode_prompt(t.tok, c) if c is not None else prompts[i] for i, c in enumerate(ctx)
        ]
        second = generate(t, second_prompts, m)
        return guided, second, t.scorer.score(second, examples)  # against the original problem

    def _reflect_round(self, fb, examples, prompts, texts, correct, m):
        """The policy as reflector: on each prompt's first failure, ``m`` sampled
        reflections and one guided rollout per reflection. Returns ``(guided [P], second
        [P * m] prompt-major, reflections or None, reflected prompts, metrics)``."""
        t = self.trainer
        P = len(examples)
        failed = first_failures(examples, texts, correct)
        reflected = [i for i, f in enumerate(failed) if f is not None]
        second_prompts = [prompts[i] for i in range(P) for _ in range(m)]
        reflections, metrics, exact = None, {}, []
        notes: list[str] = [""] * (P * m)  # the reflection each second-round row read
        bank = self.bank.render(fb.show) if fb.bank else ""
        if reflected:
            asks = [encode_prompt(t.tok, fb.reflect(examples[i].prompt, failed[i], bank))
                    for i in reflected]  # fmt: skip
            reflections = generate(t, asks, m)
            written = reflections.texts(t.tok)
            for k, i in enumerate(reflected):
                e, task = examples[i], self._task_of(examples[i])
                for j in range(m):
                    note = notes[i * m + j] = written[k * m + j]
                    guide = fb.prompt(e.prompt, failed[i], note, bank)
                    second_prompts[i * m + j] = encode_prompt(t.tok, guide)
                    if task is not None and (d := task.feedback(failed[i], e)):
                        exact.append(float(note.strip() == task.lesson(d)))
        if exact:  # against the verifier's own diagnosis, where the task has one
            metrics["reflect/exact"] = sum(exact) / len(exact)
        guided = torch.tensor([f is not None for f in failed])
        return guided, generate(t, second_prompts, 1), reflections, reflected, metrics, notes

    def _bank_verified(self, notes: list[str], verified: torch.Tensor) -> dict[str, float]:
        """Keep the reflections whose guided attempt was verified (the bank's update)."""
        for note, ok in zip(notes, verified.tolist(), strict=True):
            if ok and note.strip():
                self.bank.add(note.strip(), self.trainer.step)
        return {"reflect/bank_size": float(len(self.bank.entries))}

    def state_dict(self) -> tuple[Any, dict]:
        """The guidance bank (reflections that led to verified attempts)."""
        return self.bank.state_dict(), {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.bank.load_state_dict(state)
        self.bank.capacity = max(1, self.params.bank)  # (the run's setting, if changed)

    def collect(self, want: int | None = None, given=None) -> Collected:
        t, fb = self.trainer, self.params
        t0 = time.perf_counter()
        P = t.cfg.rollout.prompts_per_step
        n, m = fb.split(t.preset.group_size)
        examples = t.prompts.next_batch(P)
        prompts = [encode_prompt(t.tok, e.prompt) for e in examples]
        plain = generate(t, prompts, n)
        res1 = t.scorer.score(plain, examples)
        acc1 = t.scorer.accuracy(res1.components)
        texts = plain.texts(t.tok)
        reflections, reflected, metrics = None, [], {}
        if fb.reflector == "policy":  # RubricEM: the policy writes the guidance
            guided, second, reflections, reflected, metrics, notes = self._reflect_round(
                fb, examples, prompts, texts, acc1 > 0, m
            )
            res2 = t.scorer.score(second, [e for e in examples for _ in range(m)])
            if fb.bank:
                metrics |= self._bank_verified(notes, t.scorer.accuracy(res2.components) > 0)
        else:
            guided, second, res2 = self._guided_round(fb, examples, prompts, texts, acc1 > 0, m)
        acc2 = t.scorer.accuracy(res2.components)
        out = assemble(fb, plain, second, prompts, guided, acc2 > 0)
        rows = [examples[i] for i in out.example]
        parts = [
            out.batch,
            torch.cat([res1.rewards, res2.rewards])[out.source],
            torch.cat([res1.components, res2.components])[out.source],
            out.roles,
        ]
        if fb.meta and reflections is not None:  # the meta-policy: a group per failure
            rows += self._add_reflections(parts, reflections, reflected, res2, examples, m)
            metrics["reflect/rows"] = float(len(rows) - len(out.example))
        for k, v in {**res1.metrics, **res2.metrics}.items():
            both = k.endswith(("timeouts", "errors"))
            metrics[k] = res1.metrics.get(k, 0.0) + res2.metrics.get(k, 0.0) if both else v
        g2 = guided[:, None].expand(P, m).flatten()
        metrics.update(
            {
                "fbos/plain_accuracy": float(acc1.mean()),
                # the plain round on the prompts the guided round re-rolled (its comparison)
                "fbos/plain_accuracy_guided": float(acc1.view(P, -1)[guided].mean())
                if bool(guided.any())
                else 0.0,
                "fbos/guided_prompts": float(guided.float().mean()),
                "fbos/guided_accuracy": float(acc2[g2].mean()) if bool(g2.any()) else 0.0,
                "fbos/epa_rows": float(out.layout.epa.sum()),
                "fbos/rescued": float(rescued(acc1.view(P, n) > 0, out.layout, m).sum()),
                "time/rollout": time.perf_counter() - t0,
            }
        )
        batch, rewards, comps, roles = parts
        acc = t.scorer.accuracy(comps)
        return Collected(batch, rows, rewards, comps, acc, metrics, roles=roles)

    @staticmethod
    def _add_reflections(parts: list, reflections, reflected, res2, examples, m) -> list:
        """Append the reflections to ``parts`` (batch, rewards, components, roles), each
        rewarded by the attempt it guided (TRAIN: trained, but not rollouts of the task,
        so the rollout statistics skip them). Returns their examples."""
        guided_rows = torch.tensor([i * m + j for i in reflected for j in range(m)])
        batch, rewards, comps, roles = parts
        parts[0] = RolloutBatch.concat([batch, reflections])
        parts[1] = torch.cat([rewards, res2.rewards[guided_rows]])
        parts[2] = torch.cat([comps, res2.components[guided_rows]])
        parts[3] = torch.cat([roles, torch.full((len(guided_rows),), TRAIN, dtype=roles.dtype)])
        return [examples[i] for i in reflected for _ in range(m)]
