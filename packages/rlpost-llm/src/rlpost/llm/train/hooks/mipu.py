"""MIPU (004-26): each update is a candidate, its ratios referenced to the sampler's own
log-probs; it is synchronised to the rollout engine and kept only if the engine's
log-probs of the batch say the inference policy improved (``rlpost.core.mipu``:
``gain - penalty * kl >= min_gain``); a rejected candidate leaves the weights, the
optimiser and the schedule as they were (``train.mipu``)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from rlpost.core.contract import Declares, Property
from rlpost.core.mipu import inference_gap
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook
from rlpost.llm.train.inputs import Role

_ENGINE = "scores the candidate on an in-process engine right after its update"


@STEP_HOOKS.register
class MipuHook(StepHook):
    name = "mipu"
    label = "train.mipu"
    order = 25  # after pi_old's forward, before anything reads it
    state_key = "mipu_rejected"
    example = ("train.mipu={}",)
    declares = Declares(
        requires={
            Property.IN_PROCESS_ENGINE: _ENGINE,
            Property.TORCH_ENGINE: _ENGINE,
            Property.SAME_THREAD: _ENGINE,
            Property.PER_STEP: _ENGINE,
            Property.ONE_PROCESS: "accepts or rejects each update in one process",
            Property.UNSHARDED: "snapshots the whole weights",
        }
    )

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return cfg.train.mipu is not None

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.rejected = 0  # candidates undone so far
        self.snapshot = None

    def provide(self, step: Any) -> None:
        b = step.batch
        step[Role.OLD_LOGP] = b.logprobs * b.mask  # the ratio's reference: the sampler's

    @torch.no_grad()
    def begin_update(self, col: Any) -> None:
        """The policy's weights, the optimiser's and the schedule's state, copied."""
        t = self.trainer
        weights = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        self.snapshot = (weights, copy.deepcopy(t.optimizer.state_dict()), t.scheduler.state_dict())

    def end_update(self, step: Any, metrics: dict[str, float]) -> None:
        """The candidate just applied, synchronised to the engine, scored there; a
        rejected one is undone (weights, optimiser, schedule, version)."""
        t = self.trainer
        if not t.applied:
            return
        mc = t.cfg.train.mipu
        t.sync_engine()  # the candidate on the inference side
        eng_model = t.engine.model
        was = eng_model.training
        eng_model.eval()
        try:
            cand = t.forwards.nograd(eng_model, step.batch).logp
        finally:
            eng_model.train(was)
        gap = inference_gap(cand, step.batch.logprobs, step[Role.ADVANTAGES], step.mask)
        ok = gap.accepts(mc.penalty, mc.min_gain)
        if not ok:
            weights, opt_state, sched_state = self.snapshot
            t.model.load_state_dict(weights)
            t.optimizer.load_state_dict(opt_state)
            t.scheduler.load_state_dict(sched_state)
            t.version -= 1
            t.applied = False
            self.rejected += 1
            t.sync_engine()  # the engine back on the kept weights
        metrics.update(
            {
                "mipu/accepted": float(ok),
                "mipu/gain": gap.gain,
                "mipu/kl": gap.kl,
                "mipu/rejected": float(self.rejected),
            }
        )

    def state_dict(self) -> tuple[Any, dict]:
        return self.rejected, {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.rejected = int(state)
