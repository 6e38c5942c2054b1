"""FBOS-RL's guided round and the batch it trains on (catalog 000-15).

The objectives and the row-level decision are :mod:`rlpost.core.feedback`'s; this module
does the token work the trainer needs:

* :func:`guided_contexts`: for each prompt, the guided prompt built from its first plain
  rollout that failed *and* that the task's verifier could diagnose
  (:meth:`~rlpost.llm.data.tasks.Task.feedback`, e.g. ``"57+10"``: 57 is short by tens), or
  ``None`` (every rollout right, or no failure the verifier could say anything about);
* :func:`first_failures`: for the policy reflector (RubricEM's reflection meta-policy),
  each prompt's first plain rollout the judge failed, the attempt the policy reflects on;
* :func:`assemble`: the step's rows from the two rounds: plain rollouts and unguided
  second-round rollouts in the prompt's group, EPA's copies of the verified guided
  solutions under the original prompt's tokens (the completion tokens unchanged), ECC's
  guided rollouts in a group of their own per guided prompt.

EPA copies are marked :data:`~rlpost.core.peers.TRAIN` (trained, but sampled under
another context: the behaviour-mismatch metrics and the rollout statistics skip them),
every other row :data:`~rlpost.core.peers.OWN`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rlpost.core.feedback import FBOSLayout, FeedbackExploration, fbos_layout
from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.engines.base import RolloutBatch


def guided_contexts(
    fb: FeedbackExploration,
    examples: Sequence[Example],
    texts: Sequence[str],
    correct: Tensor,
    feedback: Callable[[str, Example], str],
) -> list[str | None]:
    """``texts`` / ``correct`` ``[P * n]``: the plain round, prompt-major (``n`` per
    prompt); ``feedback(completion, example)``: the environment's diagnosis (``""``:
    none). Returns one guided prompt (or ``None``) per example."""
    P = len(examples)
    if P == 0 or len(texts) % P:
        raise ValueError(f"{len(texts)} plain rollouts do not split over {P} prompts")
    n = len(texts) // P
    out: list[str | None] = []
    for i, e in enumerate(examples):
        if not isinstance(e.prompt, str):
            raise ValueError("feedback exploration needs text prompts (a task's), not chat")
        ctx = None
        for j in range(i * n, (i + 1) * n):
            if bool(correct[j]):
                continue
            f = feedback(texts[j], e)
            if f:
                ctx = fb.prompt(e.prompt, texts[j], f)
                break
        out.append(ctx)
    return out


def first_failures(
    examples: Sequence[Example], texts: Sequence[str], correct: Tensor
) -> list[str | None]:
    """Each prompt's first failed plain rollout (``None``: every rollout right), with
    ``texts`` / ``correct`` ``[P * n]`` as in :func:`guided_contexts`."""
    P = len(examples)
    if P == 0 or len(texts) % P:
        raise ValueError(f"{len(texts)} plain rollouts do not split over {P} prompts")
    n = len(texts) // P
    out: list[str | None] = []
    for i, e in enumerate(examples):
        if not isinstance(e.prompt, str):
            raise ValueError("feedback exploration needs text prompts (a task's), not chat")
        out.append(
            next((texts[j] for j in range(i * n, (i + 1) * n) if not bool(correct[j])), None)
        )
    return out


class Assembled(NamedTuple):
    batch: RolloutBatch  # the rows trained on (groups: prompts 0..P-1, then ECC groups)
    source: Tensor  # [R] index of each row in cat(plain round, guided round)
    example: list[int]  # [R] the example (prompt index) each row is verified against
    roles: Tensor  # [R] OWN, or TRAIN for EPA's off-context copies
    layout: FBOSLayout


def assemble(
    fb: FeedbackExploration,
    plain: RolloutBatch,
    second: RolloutBatch,
    prompt_ids: Sequence[Sequence[int]],
    guided: Tensor,
    second_correct: Tensor,
) -> Assembled:
    """The step's rows (see the module docstring). ``plain``: ``n`` rollouts of each of
    the ``P`` prompts ``prompt_ids``; ``second``: ``m`` rollouts of each second-round
    prompt (the guided one where ``guided[i]``, else the original);
    ``second_correct`` ``[P * m]``: the verifier's verdicts on ``second``."""
    P = len(prompt_ids)
    n, m = len(plain) // P, len(second) // P
    lay = fbos_layout(fb, guided, second_correct.view(P, m))
    both = RolloutBatch.concat([plain, second])
    src: list[int] = []
    pids: list[list[int]] = []
    group: list[int] = []
    roles: list[int] = []
    example: list[int] = []

    def row(i: int, ids: Sequence[int], g: int, role: int, ex: int) -> None:
        src.append(i)
        pids.append(list(ids))
        group.append(g)
        roles.append(role)
        example.append(ex)

    ecc_group = {k: P + j for j, k in enumerate(torch.nonzero(guided).flatten().tolist())}
    for i in range(P):  # each prompt's group: plain rows, unguided second-round rows, EPA
        for j in range(i * n, (i + 1) * n):
            row(j, prompt_ids[i], i, OWN, i)
        for j in range(i * m, (i + 1) * m):
            if lay.plain[j]:
                row(len(plain) + j, prompt_ids[i], i, OWN, i)
            elif lay.epa[j]:
                row(len(plain) + j, prompt_ids[i], i, TRAIN, i)
    for i, g in ecc_group.items():  # ECC: the guided rollouts in their own context
        for j in range(i * m, (i + 1) * m):
            if lay.ecc[j]:
                row(len(plain) + j, second.prompt_ids[j], g, OWN, i)
    idx = torch.tensor(src, dtype=torch.long)
    sel = both.select(idx)
    _, dense = torch.unique(torch.tensor(group), return_inverse=True)  # no empty groups
    batch = dataclasses.replace(sel, prompt_ids=pids, group=dense)
    return Assembled(batch, idx, example, torch.tensor(roles, dtype=torch.long), lay)


__all__ = ["Assembled", "assemble", "first_failures", "guided_contexts"]
