"""Experience shared between heterogeneous policies (Mutual RL, catalog 001-11).

Several policies, each with its own parameters, objective and tokenizer, answer the same
prompts in the same step. Mutual RL's three probes decide what a policy does with the
answers of its peers to a prompt it also answered (``PeerSharing.mode``):

``pool``      Peer Rollout Pooling (PRP, data level): the peers' responses join the
              policy's own group; the group-relative advantage is taken over the pooled
              group and every pooled response is trained on, its density ratio to the
              peer that generated it weighted by the preset's correction (F-TIS, 000-09).
``baseline``  Cross-Policy GRPO Advantage Sharing (XGRPO, value level): the peers'
              rewards join the group's baseline (mean and spread) but only the policy's
              own responses are trained on, so its actor support stays on-policy.
``rescue``    Success-Gated Transfer (SGT, outcome level): for a prompt on which none of
              the policy's own responses succeeded (its *rescue set*), the peers'
              *verified* successes join the group and are trained on; nothing else
              crosses over.

:func:`peer_roles` is that decision, row by row: a peer response is dropped, trained on
(:data:`TRAIN`), or enters the advantage only (:data:`BASELINE`); the policy's own rows
are :data:`OWN`. The trainer zeroes the loss mask of baseline rows after the advantage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

DROP, OWN, TRAIN, BASELINE = -1, 0, 1, 2
MODES = ("pool", "baseline", "rescue")


@dataclass(frozen=True)
class PeerSharing:
    """How a policy uses its peers' responses (see the module docstring).

    ``max_per_group``: at most this many peer responses enter one group (the first in
    the peers' order; ``None``: all)."""

    mode: Literal["pool", "baseline", "rescue"]
    max_per_group: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"peer sharing mode must be one of {', '.join(MODES)}, got {self.mode!r}"
            )
        if self.max_per_group is not None and self.max_per_group < 1:
            raise ValueError(f"max_per_group must be >= 1, got {self.max_per_group}")


def peer_roles(
    sharing: PeerSharing,
    own_group: Tensor,
    own_correct: Tensor,
    peer_group: Tensor,
    peer_correct: Tensor,
) -> Tensor:
    """``[M]`` int64: each peer response's role in the policy's batch.

    ``own_group`` / ``own_correct`` ``[N]``: the policy's responses, their group and
    whether the verifier accepted them; ``peer_group`` ``[M]``: the policy's group of the
    prompt each peer response answers (``-1``: a prompt the policy did not answer this
    step, always dropped); ``peer_correct`` ``[M]``: the verifier's verdict on it (the
    policy's own verifier: a transferred success is one the policy itself verifies).
    """
    own_group, peer_group = own_group.long(), peer_group.long()
    matched = peer_group >= 0
    roles = torch.full(peer_group.shape, DROP, dtype=torch.long)
    if sharing.mode == "pool":
        roles[matched] = TRAIN
    elif sharing.mode == "baseline":
        roles[matched] = BASELINE
    else:
        n = 1 + max(
            int(own_group.max()) if own_group.numel() else -1,
            int(peer_group.max()) if peer_group.numel() else -1,
        )
        solved = torch.zeros(max(n, 0)).index_add_(0, own_group, own_correct.float()) > 0
        rescue = matched & peer_correct.bool()
        rescue[matched] &= ~solved[peer_group[matched]]
        roles[rescue] = TRAIN
    if sharing.max_per_group is not None:
        seen: dict[int, int] = {}
        for i in torch.nonzero(roles != DROP).flatten().tolist():
            g = int(peer_group[i])
            seen[g] = seen.get(g, 0) + 1
            if seen[g] > sharing.max_per_group:
                roles[i] = DROP
    return roles


__all__ = ["BASELINE", "DROP", "MODES", "OWN", "TRAIN", "PeerSharing", "peer_roles"]
