"""Ranking-aware calibration (RAC, catalog 000-19): two confidence losses from comparisons
group-based RL already has.

The confidence of a response is the policy's own: its mean token log-probability
``c_i = sum_t m_it log pi(y_it) / sum_t m_it`` (the log of the geometric-mean token
probability; :func:`sequence_confidence`), differentiable through the training forward.
We take it where the task has no verbalised confidence to parse, as none of the built-in
tasks does.

* **Ranking-aware group loss** (:func:`ranking_loss`): within a group, a better response
  (higher reward) must get a higher confidence than a worse one. Per group, the mean over
  its strictly ordered pairs ``(i, j)``, ``q_i > q_j``, of ``max(0, c_j - c_i + margin)``;
  a group without such a pair (all rewards equal) contributes 0. With ``margin = 0`` the
  loss is exactly 0 when the confidence order matches the quality order and positive
  when any pair is inverted.
* **Clean/corrupted pairwise loss** (:func:`corruption_loss`): the same response must be
  less confident when its input is degraded: ``max(0, c~_i - c_i + margin)`` with ``c~_i``
  the confidence of response ``i`` given a corrupted prompt.

Both return sums; the caller divides by the step's number of groups / responses, so
micro-batches of whole groups add up to the full batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sequence_confidence(logp: Tensor, mask: Tensor) -> Tensor:
    """``[B]``: the mean token log-probability of each response (0 for an empty one)."""
    return (logp * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def ranking_loss(conf: Tensor, quality: Tensor, group: Tensor, margin: float = 0.0) -> Tensor:
    """Sum over groups of the mean hinge ``max(0, c_j - c_i + margin)`` over the group's
    pairs with ``quality_i > quality_j`` (``group``: ``[B]`` group ids)."""
    same = group[:, None] == group[None, :]
    better = (quality[:, None] > quality[None, :]) & same  # [i, j]: i better than j
    hinge = (conf[None, :] - conf[:, None] + margin).clamp_min(0.0)  # c_j - c_i + margin
    per_row = (hinge * better).sum(1)  # row i's inversions against the rows it beats
    ids, inv = torch.unique(group, return_inverse=True)
    pairs = torch.zeros(len(ids), device=conf.device).index_add_(0, inv, better.sum(1).float())
    total = torch.zeros(len(ids), dtype=conf.dtype, device=conf.device).index_add_(0, inv, per_row)
    return (total / pairs.clamp_min(1.0)).sum()


def corruption_loss(conf_clean: Tensor, conf_corrupt: Tensor, margin: float = 0.0) -> Tensor:
    """Sum over responses of ``max(0, c~_i - c_i + margin)``: confidence must fall when the
    input is corrupted."""
    return (conf_corrupt - conf_clean + margin).clamp_min(0.0).sum()
