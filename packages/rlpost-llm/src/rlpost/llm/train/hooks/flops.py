"""``run.flops`` (default on): RACE's FLOP accounting (004-01) of the run, per step and
summed (:mod:`rlpost.core.flops`).

Every model the run holds is counted where it runs: the policy, the engine's own copy
and a reference copy through :class:`~rlpost.core.flops.FlopCounter`'s embedding hooks;
a distillation teacher's forwards go to ``feedback``. A forward with gradients on is the
update's (forward + backward); an inference forward in the generator's own thread, or
between the end of an update and the next step's rollouts arriving, is ``rollout``
(``eval`` when the evaluation that follows an update ran it); one inside the update
(old log-probs, the reference, a self-teacher) is ``update``. A generator thread's
forwards (one step off, DORA) count to the step that trains on what they generated: they
are held until the next rollouts arrive, whenever the thread ran them, so the per-step
split does not depend on thread timing (and the held count is checkpointed with the
batch generated ahead). An engine outside this
process (Ray workers, vLLM) is counted from the batch it returns: ``2 N`` x (prompt +
completion tokens) per row. Rule-based rewards cost no model FLOPs.

Logged per step: ``flops/rollout``, ``flops/update``, ``flops/feedback`` (and
``flops/eval`` on evaluation rows), and the run's totals so far under ``flops/total/*``
(checkpointed, so a resumed run continues them); ``rlpost-llm flops RUN ...`` prints the
split of finished runs side by side (:mod:`rlpost.llm.tools.flops`).
"""

from __future__ import annotations

import threading
from typing import Any

from rlpost.core.flops import FlopCounter, forward_flops
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook

BUCKETS = ("rollout", "update", "feedback", "eval")


@STEP_HOOKS.register
class FlopsHook(StepHook):
    name = "flops"
    label = "run.flops (RACE FLOP accounting)"
    order = 5  # first to see an update begin, first to see it end
    state_key = "flops"
    example = ("run.flops=true",)

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return bool(getattr(cfg.run, "flops", False))

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.main_thread = threading.get_ident()
        self.phase = "pending"  # until an update begins, or the rollouts / an eval arrive
        self.counters: list[FlopCounter] = []
        self.hooked: set[int] = set()
        self.totals = dict.fromkeys(BUCKETS, 0)
        self.step_counts = dict.fromkeys(BUCKETS, 0)
        self.ahead = 0  # a generator thread's, for the rollouts that arrive next
        self._count(trainer.model, self._bucket)

    # ------------------------------------------------------------------ counting
    def _bucket(self, grad: bool) -> str:
        """The policy's and the engine copy's: trained, generated beside the update (a
        generator thread), else the phase (an update's scoring, or rollouts / an eval)."""
        if grad:
            return "update"
        if threading.get_ident() != self.main_thread:
            return "ahead"
        return self.phase

    def _count(self, model: Any, bucket: Any) -> None:
        if model is None or id(model) in self.hooked or not hasattr(model, "get_input_embeddings"):
            return
        self.hooked.add(id(model))
        self.counters.append(FlopCounter(model, bucket))

    def _attach_others(self) -> None:
        """The models built after this hook: the engine's copy, the reference copy, the
        teachers. Hooked when the first rollouts arrive, before a generator thread starts
        the next batch on the engine's copy (hooked later, the forwards the thread ran
        before would go uncounted, as many as thread timing let it run)."""
        t = self.trainer
        self._count(getattr(t.engine, "model", None), self._bucket)
        for c in t.components.items:
            ref = getattr(c, "reference", None)
            self._count(getattr(ref, "model", None), lambda grad: "update")
            for teacher in getattr(getattr(c, "teachers", None), "teachers", ()):
                self._count(teacher.model, lambda grad: "feedback")

    def _drain(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.counters:
            for k, v in c.take().items():
                out[k] = out.get(k, 0) + v
        return out

    def _add(self, counts: dict[str, int], pending_to: str) -> None:
        for k, v in counts.items():
            if k == "ahead":
                self.ahead += v
            else:
                self.step_counts[pending_to if k == "pending" else k] += v

    # ------------------------------------------------------------------ phases
    def collected(self, col: Any) -> Any:
        self._attach_others()
        counts = self._drain()
        self._add(counts, "rollout")
        generated, self.ahead = self.ahead, 0
        self.step_counts["rollout"] += generated
        if (
            not generated
            and not counts.get("rollout")
            and not counts.get("pending")
            and len(col.batch)
        ):
            self.step_counts["rollout"] += self._outside(col)  # Ray workers, vLLM
        return col

    def _outside(self, col: Any) -> int:
        """An out-of-process engine's rollouts, from the batch: ``2 N`` per token."""
        b = col.batch
        tokens = sum(len(p) for p in b.prompt_ids) + int(b.mask.sum())
        return forward_flops(self.counters[0].n_params, tokens)

    def begin_update(self, col: Any) -> None:
        self._attach_others()  # (a source that trains as it generates: no rollouts yet)
        self._add(self._drain(), "rollout")
        self.phase = "update"

    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        self._add(self._drain(), "update")
        self.phase = "pending"
        for k in ("rollout", "update", "feedback"):
            metrics[f"flops/{k}"] = float(self.step_counts[k])
            self.totals[k] += self.step_counts[k]
            self.step_counts[k] = 0
        metrics.update(self._total_metrics())

    def evaluated(self, metrics: dict[str, float]) -> None:
        self._add(self._drain(), "eval")
        metrics["flops/eval"] = float(self.step_counts["eval"])
        self.totals["eval"] += self.step_counts["eval"]
        self.step_counts["eval"] = 0
        metrics.update(self._total_metrics())

    def _total_metrics(self) -> dict[str, float]:
        out = {f"flops/total/{k}": float(v) for k, v in self.totals.items()}
        out["flops/total"] = float(sum(self.totals[k] for k in ("rollout", "update", "feedback")))
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> tuple[Any, dict]:
        self._add(self._drain(), "rollout")  # (a generator thread's so far: held)
        return {**self.totals, "ahead": self.ahead}, {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        state = dict(state)
        self.ahead = int(state.pop("ahead", 0))
        self.totals.update({k: int(v) for k, v in state.items()})

    def close(self) -> None:
        for c in self.counters:
            c.close()
