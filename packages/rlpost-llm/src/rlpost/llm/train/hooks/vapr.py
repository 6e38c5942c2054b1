"""REVA-PO's VAPR (004-09): the best validation checkpoint so far, written atomically
beside the run; at every evaluation the policy and the reference are reset to it whenever
the current evaluation is worse (``Preset.hooks``: ``validation_reset``;
``algo.validation_reset`` switches it on any preset)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from rlpost.core.contract import Declares, Property
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook


class ValidationAnchor:
    """The best validation checkpoint so far (``<run>/vapr-best.safetensors``)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "vapr-best.safetensors"
        self.best: float | None = None
        self.resets = 0

    def update(self, model: torch.nn.Module, accuracy: float) -> bool:
        """Record ``model`` as the anchor when ``accuracy`` is the best so far; returns
        ``True`` when it is worse than the anchor (the trainer then resets to it)."""
        if self.best is None or accuracy >= self.best:
            tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
            save_model(model, str(tmp))
            os.replace(tmp, self.path)
            self.best = accuracy
            return False
        return True

    def restore(self, *modules: torch.nn.Module) -> None:
        """Load the anchor's weights into each module (policy, reference)."""
        for m in modules:
            load_model(m, str(self.path), strict=True)
        self.resets += 1

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "resets": self.resets}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.best, self.resets = sd["best"], sd["resets"]


@STEP_HOOKS.register
class ValidationResetHook(StepHook):
    name = "validation_reset"
    label = "validation resets (REVA-PO)"
    option = "validation_reset"
    state_key = "vapr"
    example = ("algo.validation_reset=true", "run.eval_every=1")
    declares = Declares(requires={Property.UNSHARDED: "restore whole weights"})

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        if not cfg.run.eval_every:
            raise ValueError("validation_reset (REVA-PO's VAPR) needs run.eval_every > 0")

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.anchor = ValidationAnchor(trainer.run_dir)

    def evaluated(self, metrics: dict[str, float]) -> None:
        t = self.trainer
        if self.anchor.update(t.model, metrics["eval/accuracy"]):
            ref = t.components.get("reference")
            refs = [ref.reference.model] if ref is not None and not ref.reference.lora else []
            self.anchor.restore(t.model, *refs)
            t.sync_engine()
            metrics["vapr/reset"] = 1.0
        metrics["vapr/best"] = float(self.anchor.best)
        metrics["vapr/resets"] = float(self.anchor.resets)

    def state_dict(self) -> tuple[Any, dict]:
        return self.anchor.state_dict(), {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.anchor.load_state_dict(state)
