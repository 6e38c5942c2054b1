"""Rows whose gradient is exactly zero, left out of the training forward and backward.

When the objective is linear in the advantage
(``rlpost.core.objectives.INERT_AT_ZERO_ADVANTAGE``, checked off-policy by the core's
contract test) and nothing else in the loss reads the rows (no KL term in the loss, no
entropy bonus, no distillation), two kinds of rows add nothing to a step's gradient:

* a row whose advantages are all exactly 0 (every response of a group scored alike, so
  GRPO's group baseline cancels the reward);
* a row whose loss mask is empty (a response cut by ``max_new_tokens`` under
  ``train.overlong_mask``): every loss entry gives masked tokens zero gradient.

The loss normalisers count the skipped rows' tokens as before (``StepInputs.counts``), so
the summed gradient equals the full batch's up to float rounding (the forward holds fewer
rows). Sparse-reward runs have many such groups: DAPO's dynamic sampling
(arXiv:2503.14476) drops them from the batch and samples more; this keeps the batch and
its normalisers and saves their forward and backward. A KL or distillation term is left alone even on an empty
mask: its gradient is exactly 0 only when the training forward runs the same layout as
the reference's or teacher's (a self-teacher's gap is then 0 bit for bit).

The skip applies only where it is exact: a loss coupling at most the rows of a group
(whole inert groups are skipped then), one process (data-parallel ranks must run the
same number of micro-batches), and no step component that takes part in each
micro-batch's loss or backward (the critic's value loss, an extra loss term, per-sample
gradients). At least one row always trains, so every parameter receives a gradient
(zeros when nothing else trains) and the optimiser steps as on the full batch: bit for
bit when every row is inert (the state AdamW carries moves the weights either way).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Coupling
from rlpost.core.masked import group_sum
from rlpost.core.objectives import INERT_AT_ZERO_ADVANTAGE
from rlpost.llm.train.components import StepComponent

# the phases that see each micro-batch's loss or backward: a component overriding one
# needs every row (the critic's value loss, an extra loss term, per-sample gradients)
_PER_ROW_PHASES = ("micro_batch", "extra_loss", "before_backward", "after_backward")


def why_not(cfg: Any, recipe: Any, components: Any, world: int) -> str | None:
    """Why no row of this run may be skipped (None: inert rows are skipped)."""
    p = recipe.preset
    if not cfg.optim.skip_inert_rows:
        return "optim.skip_inert_rows is false"
    if recipe.objective.name not in INERT_AT_ZERO_ADVANTAGE:
        return f"the objective {recipe.objective.name!r} is not linear in the advantage"
    if recipe.kl_in_loss or p.entropy_coef != 0 or recipe.distill is not None:
        return "a KL, entropy or distillation term reads every row"
    if world > 1:
        return "data-parallel ranks run equal micro-batches"
    if recipe.coupling() == Coupling.BATCH:
        return f"the loss couples the whole batch ({recipe.coupling()})"
    for c in components:
        touched = [
            q for q in _PER_ROW_PHASES if getattr(type(c), q) is not getattr(StepComponent, q)
        ]
        if touched:
            return f"step component {c.name!r} takes part in every micro-batch ({touched[0]})"
    return None


def inert_rows(
    step_mask: Tensor, advantages: Tensor, groups: Tensor, trained: Tensor, by_group: bool
) -> Tensor:
    """``[N]`` bool: the ``trained`` rows to leave out of the update (never all of them).

    ``step_mask`` the loss mask ``[N, L]``, ``advantages`` ``[N, L]`` or ``[N]``, ``groups``
    each row's group label ``[N]``; ``by_group``: only rows of groups inert throughout."""
    valid = step_mask > 0
    moving = advantages != 0  # (NaN too: a bad advantage still reaches the loss)
    moving = (moving & valid).any(1) if moving.dim() == 2 else moving & valid.any(1)
    inert = ~moving
    if by_group and len(groups):
        inert = group_sum(moving.long(), groups) == 0
    inert &= trained
    if bool(trained.any()) and bool(inert[trained].all()):  # keep one: every gradient
        first = int(torch.nonzero(trained)[0])
        keep = groups == groups[first] if by_group else torch.arange(len(inert)) == first
        inert &= ~keep
    return inert


__all__ = ["inert_rows", "why_not"]
