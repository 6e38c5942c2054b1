"""Step-level credit from a hindsight self-teacher: StepOPSD (catalog 000-03).

A multi-turn trajectory is cut into *step segments*, one per agent action (the tokens of
turn ``u``, ``turn_ids == u``). A teacher, the policy itself given a hindsight-enriched
context (e.g. a solution found by another rollout of the same task), rescores every
sampled token; the token-level log-probability gap ``teacher - student`` says which steps
the hindsight endorses. :func:`step_opsd` turns the gaps into a *sign-preserving*
reshaping of the trajectory's GRPO advantage with a normalised per-step credit budget:
credit moves between the steps of a trajectory, toward the endorsed steps of a success
and the disowned steps of a failure, but a trajectory's advantage never changes sign.

Shapes: ``B`` trajectories, ``T`` tokens, ``U`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    group_normalize,
    response_rewards,
)
from rlpost.core.advantages.turns import turn_exists
from rlpost.core.contract import Coupling, Input


@dataclass(frozen=True)
class StepOPSDParams:
    alpha_clip: float = 0.2  # local trust region: |shaping of one step| <= alpha_clip
    lambda_mix: float = 0.5  # global mixing strength of the shaping
    scale_by_std: bool = True  # the outcome advantage's GRPO normalisation
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha_clip < 1.0:
            raise ValueError(f"alpha_clip must be in [0, 1), got {self.alpha_clip}")
        if not 0.0 <= self.lambda_mix <= 1.0:
            raise ValueError(f"lambda_mix must be in [0, 1], got {self.lambda_mix}")


def step_scores(gap: torch.Tensor, turn_ids: torch.Tensor, valid: torch.Tensor, U: int):
    """``[B, U]`` mean token gap of each step and ``[B, U]`` its token count."""
    at = turn_ids.clamp_min(0).long()
    g = torch.where(valid, gap.float(), 0.0)
    total = torch.zeros(gap.shape[0], U, device=gap.device).scatter_add_(1, at, g)
    count = torch.zeros_like(total).scatter_add_(1, at, valid.float())
    return total / count.clamp_min(1.0), count


@ADVANTAGES.register(
    "step_opsd",
    StepOPSDParams,
    needs={Input.TURNS, Input.BEHAVIOUR_LOGPROBS, Input.TEACHER_LOGPROBS},
    coupling=Coupling.GROUP,
)
def step_opsd(inp: AdvantageInput, p: StepOPSDParams) -> AdvantageOutput:
    """StepOPSD's advantage (catalog 000-03), for trajectory b of prompt g and step u:

        A_b     = GRPO's group-normalised outcome advantage
        d_{b,u} = mean over the step's tokens of (teacher log-prob - student log-prob)
        c_{b,u} = (d_{b,u} - mean_u d_{b,.}) / (max_u |d_{b,u} - mean d_{b,.}| + eps)
                  the step's credit relative to its trajectory's others, in [-1, 1]
        s_{b,u} = clip(sign(A_b) c_{b,u}, -alpha_clip, alpha_clip)
        f_{b,u} = (1 + lambda_mix s_{b,u}) / (token-weighted mean over b's steps of the same)
        A_{b,t} = A_b f_{b, turn(t)}

    ``f > 0`` always (``lambda_mix <= 1``, ``alpha_clip < 1``), so the sign of every token's
    advantage is its trajectory's; the normalisation is the per-step credit budget (the
    trajectory's summed token advantage is that of GRPO: credit is moved between steps,
    never made). A trajectory with one step, or teacher log-probs equal to the student's,
    gets GRPO's advantage exactly. Inputs: ``turn_ids`` (``-1``: not an action token),
    ``logprobs`` (the student's, of the sampled tokens) and ``teacher_logprobs``.

    Our reading where the abstract is open: the step score is the mean token gap
    (length-neutral), centred and max-normalised within the trajectory; the shaping is
    multiplicative (sign-preserving by construction) with ``alpha_clip`` the per-step
    trust region and ``lambda_mix`` the global mix, the abstract's two knobs.
    """
    if inp.mask is None or inp.turn_ids is None:
        raise ValueError("step_opsd needs AdvantageInput.mask and turn_ids ([B, T])")
    if inp.logprobs is None or inp.teacher_logprobs is None:
        raise ValueError("step_opsd needs AdvantageInput.logprobs and teacher_logprobs")
    r = response_rewards(inp)
    outcome = group_normalize(r, inp.group_ids, p.scale_by_std, p.eps)  # [B]
    tid = inp.turn_ids.long()
    U = int(tid.max()) + 1 if tid.numel() and int(tid.max()) >= 0 else 1
    valid = (tid >= 0) & inp.mask.bool()
    gap = inp.teacher_logprobs.float() - inp.logprobs.float()
    if not torch.isfinite(gap[valid]).all():
        raise ValueError("step_opsd: teacher or student log-probs of action tokens are not finite")
    d, count = step_scores(gap, tid, valid, U)
    exists = turn_exists(tid, inp.mask, U)
    e = exists.float()
    n_steps = e.sum(1, keepdim=True).clamp_min(1.0)
    centred = (d - (d * e).sum(1, keepdim=True) / n_steps) * e
    credit = centred / (centred.abs().amax(1, keepdim=True) + p.eps)
    shaping = (torch.sign(outcome)[:, None] * credit).clamp(-p.alpha_clip, p.alpha_clip)
    raw = 1.0 + p.lambda_mix * shaping
    tokens = count * e
    n_tok = tokens.sum(1, keepdim=True)
    mean = torch.where(n_tok > 0, (raw * tokens).sum(1, keepdim=True) / n_tok.clamp_min(1.0), 1.0)
    factor = raw / mean  # [B, U], > 0
    per_step = outcome[:, None] * factor
    adv = torch.where(valid, per_step.gather(1, tid.clamp_min(0)), 0.0)
    spread = (factor.where(exists, 1.0).amax(1) - factor.where(exists, 1.0).amin(1)).mean()
    metrics = {
        "reward_mean": r.mean().item(),
        "adv_abs_mean": outcome.abs().mean().item(),
        "step_gap_mean": ((d * e).sum() / e.sum().clamp_min(1.0)).item(),
        "step_factor_spread": spread.item(),
    }
    return AdvantageOutput(adv, metrics=metrics)


__all__ = ["StepOPSDParams", "step_opsd", "step_scores"]
