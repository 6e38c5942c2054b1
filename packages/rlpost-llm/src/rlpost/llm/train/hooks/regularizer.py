"""A gradient regulariser (``regularizer``: an ``rlpost.core.regularizers`` entry: GAC,
Dr. Post-Training, CPO) applied to the step's summed gradient before clipping; its state
(GAC's controller, CPO's Fisher and anchor) is an explicit value it returns and the
checkpoint keeps. Its inputs come from the gradient providers
(:mod:`rlpost.llm.train.providers.gradients`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.regularizers import REGULARIZERS, GradientInput, flat_grad, set_flat_grad_
from rlpost.llm.train.hooks.base import STEP_HOOKS, StepHook
from rlpost.llm.train.providers.gradients import GradientProvider


@STEP_HOOKS.register
class RegularizerHook(StepHook):
    name = "regularizer"
    label = "a gradient regularizer"
    state_key = "regularizer"
    example = ("regularizer.name=dr_post_training", "regularizer.data.task=arithmetic")
    declares = Declares(
        requires={
            Property.WHOLE_BATCH: "regularises the whole step's gradient",
            Property.ONE_PROCESS: "reads the whole gradient in one process",
            Property.UNSHARDED: "reads whole gradients",
        }
    )

    @classmethod
    def on(cls, cfg: Any, preset: Any) -> bool:
        return cfg.regularizer is not None

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        rc = trainer.cfg.regularizer
        self.regularizer = REGULARIZERS.build(rc.name, **dict(rc.params))
        self.state: dict[str, Any] = {}

    def before_step(self, acc: Any, epoch: int) -> None:
        """Replace ``p.grad`` by the regularised gradient."""
        t = self.trainer
        params = t.updater.params()
        g = flat_grad(params)
        kw: dict[str, Any] = {"aux_grads": None, "grad_samples": None, "parameters": None}
        for c in t.components:
            if isinstance(c, GradientProvider):
                kw.update(c.gradient_input(epoch))
        events = kw.pop("events", [])
        for ev in events[:-1]:  # e.g. the previous task's end before this one's begin
            inp = GradientInput(g, task_boundary=ev, state=self.state, **kw)
            self.state = self.regularizer(inp).state
        last = events[-1] if events else None
        out = self.regularizer(GradientInput(g, task_boundary=last, state=self.state, **kw))
        self.state = out.state
        set_flat_grad_(params, out.grad)
        acc.add(out.metrics)

    def state_dict(self) -> tuple[Any, dict[str, Tensor]]:
        """JSON for the checkpoint's state, tensors as ``reg.<name>``."""
        tensors = {f"reg.{k}": v for k, v in self.state.items() if isinstance(v, Tensor)}
        rest = {k: v for k, v in self.state.items() if not isinstance(v, Tensor)}
        return rest, tensors

    def load_state_dict(self, state: Any, tensors: dict[str, Tensor]) -> None:
        reg = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("reg.")}
        self.state = {**state, **reg}
