"""Auxiliary data for gradient regularisers: supervised (prompt, answer) batches and
their mean-NLL gradients (GAC's SFT data, Dr. Post-Training's general data).

The stream of examples has a resumable position (checkpointed with the run). A batch's
loss is the mean negative log-likelihood of the reference answers (and an EOS) given the
prompts, over answer tokens; :func:`aux_gradients` returns one flat gradient per batch,
``[M, D]``, and leaves ``p.grad`` as it found it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rlpost.core.regularizers import flat_grad
from rlpost.llm.data.config import AuxDataConfig
from rlpost.llm.data.prompts import PromptSource, _load_file, encode_prompt
from rlpost.llm.data.tasks import Example, make_task
from rlpost.llm.model.policy import completion_logprobs, make_seq_batch


class AuxData:
    """An endless, resumable stream of supervised examples (a task or a local file)."""

    def __init__(self, cfg: AuxDataConfig):
        if cfg.path is not None:
            self.source = PromptSource(_load_file(cfg.path), None, [], cfg.seed)
        else:
            self.source = PromptSource(None, make_task(cfg.task, **cfg.task_params), [], cfg.seed)

    def next_batch(self, n: int) -> list[Example]:
        return self.source.next_batch(n)

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.source.load_state_dict(sd)


def sft_loss(model: torch.nn.Module, tok, examples: list[Example]) -> Tensor:
    """Mean NLL per answer token of ``answer + EOS`` given ``prompt`` (a scalar)."""
    prompts = [encode_prompt(tok, e.prompt) for e in examples]
    answers = [
        [*tok(e.answer, add_special_tokens=False).input_ids, tok.eos_token_id] for e in examples
    ]
    L = max(len(a) for a in answers)
    ids = torch.full((len(examples), L), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(examples), L)
    for i, a in enumerate(answers):
        ids[i, : len(a)] = torch.tensor(a)
        mask[i, : len(a)] = 1.0
    sb = make_seq_batch(prompts, ids, mask, tok.pad_token_id)
    logp = completion_logprobs(model, sb, 1.0, impl="auto")[0]
    m = mask.to(logp.device)
    return -(logp * m).sum() / m.sum().clamp_min(1.0)


def aux_gradients(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    tok,
    data: AuxData,
    batches: int,
    batch_size: int,
) -> tuple[Tensor, float]:
    """``[M, D]`` flat SFT gradients of ``batches`` fresh auxiliary batches over ``params``
    (their existing ``.grad`` is kept intact), and the mean auxiliary loss."""
    saved = [None if p.grad is None else p.grad.clone() for p in params]
    rows, losses = [], []
    for _ in range(batches):
        for p in params:
            p.grad = None
        loss = sft_loss(model, tok, data.next_batch(batch_size))
        loss.backward()
        rows.append(flat_grad(params).detach().clone())
        losses.append(float(loss.detach()))
    for p, g in zip(params, saved, strict=True):
        p.grad = g
    return torch.stack(rows), sum(losses) / max(len(losses), 1)
