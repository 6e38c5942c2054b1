"""Stage-Structured GRPO (RubricEM, catalog 000-30).

A research trajectory runs through stages (RubricEM's plan, research, review, answer;
here: the turns that gather evidence and the turn that answers). Instead of broadcasting
one terminal reward over every token, a judge scores each turn against its stage's rubric
(``turn_rewards`` ``[B, U]``, with ``turn_stages`` ``[B, U]`` naming each turn's stage),
and the stages are credited separately:

* ``R_{b,s}``: the mean rubric score of trajectory ``b``'s turns in stage ``s``;
* ``z_{b,s}``: ``R_{b,s}`` normalised within its prompt's group over the trajectories that
  reached stage ``s``, ``(R - mean) / (std + eps)`` (one trajectory: 0);
* a token of turn ``u`` of ``b`` gets ``outcome_weight * A_b + stage_weight *
  z_{b, stage(u)}``, ``A_b`` GRPO's outcome advantage.

So a trajectory whose research was better than its group's gets credit on its research
tokens even when its answer failed, and the answer tokens are judged by the answer's
rubric alone (with ``outcome_weight = 0``). Without ``turn_stages`` each turn index is its
own stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    group_normalize,
    response_rewards,
)
from rlpost.core.advantages.turns import checked_turns, turn_group_zscores
from rlpost.core.contract import Coupling, Input


@dataclass(frozen=True)
class StageGRPOParams:
    stage_weight: float = 1.0  # weight of the stage's group-normalised rubric score
    outcome_weight: float = 1.0  # weight of GRPO's outcome advantage on every token
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.stage_weight < 0 or self.outcome_weight < 0:
            raise ValueError(
                f"stage_weight and outcome_weight must be >= 0, got {self.stage_weight}, "
                f"{self.outcome_weight}"
            )


def stage_scores(
    turn_rewards: Tensor, turn_stages: Tensor, exists: Tensor, n_stages: int
) -> tuple[Tensor, Tensor]:
    """``(R, present)``, both ``[B, S]``: the mean rubric score of each trajectory's
    existing turns in each stage, and whether it has any."""
    B = turn_rewards.shape[0]
    on = exists & (turn_stages >= 0)
    idx = turn_stages.clamp_min(0).long()
    total = torch.zeros(B, n_stages, device=turn_rewards.device)
    count = torch.zeros(B, n_stages, device=turn_rewards.device)
    total.scatter_add_(1, idx, torch.where(on, turn_rewards.float(), 0.0))
    count.scatter_add_(1, idx, on.float())
    present = count > 0
    return torch.where(present, total / count.clamp_min(1.0), 0.0), present


@ADVANTAGES.register("stage_grpo", StageGRPOParams, needs={Input.TURNS}, coupling=Coupling.GROUP)
def stage_grpo(inp: AdvantageInput, p: StageGRPOParams) -> AdvantageOutput:
    """Stage-Structured GRPO (see the module docstring): ``[B, T]`` advantages, 0 on
    masked tokens and on tokens of no turn (``turn_ids == -1``)."""
    r = response_rewards(inp)
    outcome = group_normalize(r, inp.group_ids, True, p.eps)
    metrics = {"reward_mean": r.mean().item()}
    if inp.turn_ids is None or inp.turn_rewards is None:
        raise ValueError("stage_grpo needs AdvantageInput.turn_ids and turn_rewards (a judge)")
    tid, exists = checked_turns(inp, "stage_grpo")
    B, U = exists.shape
    stages = inp.turn_stages
    if stages is None:
        stages = torch.arange(U, device=tid.device).expand(B, U)
    stages = stages.long()
    S = int(stages.max()) + 1 if stages.numel() else 1
    R, present = stage_scores(inp.turn_rewards, stages, exists, max(S, 1))
    z = turn_group_zscores(R, present, inp.group_ids, p.eps).z  # [B, S] per (prompt, stage)
    staged = exists & (stages >= 0)
    turn_z = torch.where(staged, z.gather(1, stages.clamp_min(0)), 0.0)  # [B, U]
    turn_adv = (p.outcome_weight * outcome[:, None] + p.stage_weight * turn_z) * exists.float()
    valid = (tid >= 0) & inp.mask.bool()
    adv = torch.where(valid, turn_adv.gather(1, tid.clamp_min(0)), 0.0)
    n = present.sum().clamp_min(1)
    metrics |= {
        "adv_abs_mean": (adv.abs().sum() / valid.sum().clamp_min(1)).item(),
        "stage_z_abs_mean": (z.abs().sum() / n).item(),
        "stages_per_traj": present.float().sum(1).mean().item(),
    }
    for s in range(S):
        if bool(present[:, s].any()):
            metrics[f"stage{s}_score"] = R[present[:, s], s].mean().item()
    return AdvantageOutput(adv, metrics=metrics)


__all__ = ["StageGRPOParams", "stage_grpo", "stage_scores"]
