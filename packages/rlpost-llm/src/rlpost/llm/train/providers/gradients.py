"""The inputs of a gradient regulariser (``rlpost.core.regularizers``), computed around
the update: per-micro-batch samples of the step's gradient (GAC's noise estimate), the
flat parameters (CPO's anchor), gradients on an auxiliary data set (GAC's SFT data,
Dr. Post-Training's general data) and a curriculum's task boundaries (CPO).
:class:`~rlpost.llm.train.hooks.regularizer.RegularizerHook` reads them through
:meth:`GradientProvider.gradient_input`."""

from __future__ import annotations

from typing import Any

import torch

from rlpost.core.contract import Input
from rlpost.core.regularizers import REGULARIZERS, flat_grad
from rlpost.llm.rollout.sources import rows_per_group
from rlpost.llm.train.aux_data import AuxData, aux_gradients
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


class GradientProvider(InputProvider):
    """A provider of regulariser inputs (fields of ``GradientInput``)."""

    order = 70

    def gradient_input(self, epoch: int) -> dict[str, Any]:
        """The ``GradientInput`` fields this provider fills for ``epoch`` (each subclass)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it provides")


@INPUT_PROVIDERS.register
class GradSamplesProvider(GradientProvider):
    """The difference each micro-batch's backward makes to ``.grad``, rescaled to the batch."""

    name = "grad_samples"
    provides = frozenset({Input.GRAD_SAMPLES})

    @classmethod
    def check(cls, cfg: Any, preset: Any, recipe: Any) -> None:
        rc = cfg.regularizer
        if rc is None:
            return
        bound = REGULARIZERS.build(rc.name, **dict(rc.params))
        rows = cfg.rollout.prompts_per_step * rows_per_group(cfg, preset)
        mbs = cfg.optim.micro_batch_size
        if Input.GRAD_SAMPLES in bound.needs and mbs >= rows:
            raise ValueError(
                f"regularizer: {bound} needs per-micro-batch gradient samples: "
                f"optim.micro_batch_size ({mbs}) must be below the {rows} rows of a step"
            )

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.samples: list[torch.Tensor] = []
        self._before: torch.Tensor | None = None

    def begin_epoch(self, step: Any, epoch: int, acc: Any) -> None:
        self.samples = []

    def before_backward(self, mb: Any) -> None:
        self._before = flat_grad(self.trainer.updater.params())

    def after_backward(self, mb: Any, acc: Any) -> None:
        now = flat_grad(self.trainer.updater.params())
        self.samples.append((now - self._before) * mb.count)

    def gradient_input(self, epoch: int) -> dict[str, Any]:
        s = self.samples
        return {"grad_samples": torch.stack(s) if len(s) >= 2 else None}


@INPUT_PROVIDERS.register
class ParametersProvider(GradientProvider):
    """The current parameters, flat."""

    name = "parameters"
    provides = frozenset({Input.PARAMETERS})

    def gradient_input(self, epoch: int) -> dict[str, Any]:
        params = self.trainer.updater.params()
        return {"parameters": torch.cat([q.detach().reshape(-1) for q in params])}


@INPUT_PROVIDERS.register
class AuxGradientsProvider(GradientProvider):
    """``regularizer.batches`` gradients of the SFT loss on ``regularizer.data``."""

    name = "aux_gradients"
    provides = frozenset({Input.AUX_GRADIENTS})
    hint = "set regularizer.data (the auxiliary data set)"
    state_key = "aux_data"

    @classmethod
    def available(cls, cfg: Any) -> bool:
        return cfg.regularizer is not None and cfg.regularizer.data is not None

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.data = AuxData(trainer.cfg.regularizer.data)
        self.grads: torch.Tensor | None = None

    def begin_epoch(self, step: Any, epoch: int, acc: Any) -> None:
        t, rc = self.trainer, self.trainer.cfg.regularizer
        params = t.updater.params()
        self.grads, loss = aux_gradients(
            t.model, params, t.tok, self.data, rc.batches, rc.batch_size
        )
        acc.add({"aux/loss": loss})

    def gradient_input(self, epoch: int) -> dict[str, Any]:
        return {"aux_grads": self.grads}

    def state_dict(self) -> tuple[Any, dict]:
        return self.data.state_dict(), {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.data.load_state_dict(state)


@INPUT_PROVIDERS.register
class TaskBoundaryProvider(GradientProvider):
    """A curriculum's task boundaries before this step's update (its first epoch)."""

    name = "task_boundary"
    provides = frozenset({Input.TASK_BOUNDARY})
    hint = "set data.curriculum (a sequence of tasks)"

    @classmethod
    def available(cls, cfg: Any) -> bool:
        return bool(cfg.data.curriculum)

    def gradient_input(self, epoch: int) -> dict[str, Any]:
        t = self.trainer
        return {"events": t.prompts.events(t.step) if epoch == 0 else []}
