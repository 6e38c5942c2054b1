"""Turn-level advantages for multi-turn agentic rollouts: A²TGPO (catalog 001-15).

An agentic trajectory alternates policy turns (reasoning + a tool call) with tool outputs.
Each policy turn ``u`` carries an intrinsic process signal, its *information gain*
``IG[b, u]`` (the change in the policy's probability of the ground truth across the
turn), next to the trajectory's sparse outcome reward. :func:`a2tgpo` turns both into
per-token advantages and per-token clip ranges.

Shapes: ``B`` trajectories, ``T`` tokens, ``U`` turn slots.

* ``turn_ids`` ``[B, T]``: turn index of each token, ``-1`` for tokens the policy did not
  generate (tool outputs, padding).
* ``turn_rewards`` ``[B, U]``: IG of each turn slot.
* A turn ``u`` *exists* in trajectory ``b`` iff at least one token has
  ``turn_ids == u`` and ``mask == 1``. ``turn_rewards`` entries of turns that do not exist
  are never read (they may hold anything, NaN included), so absent turns are marked by
  having no valid token; there is no sentinel value.

What it deliberately leaves out: computing IG itself (that needs the policy's
probability of the ground-truth answer after each turn, a rollout-side quantity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    broadcast,
    group_normalize,
    response_rewards,
)
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats


class TurnZ(NamedTuple):
    """Turn-group normalised information gain (all ``[B, U]``)."""

    z: Tensor  # (IG - mean) / (std + eps) within (prompt, turn index); 0 where absent
    exists: Tensor  # bool: the trajectory has this turn
    group_size: Tensor  # trajectories of the same prompt that reached this turn (0 if absent)


def turn_exists(turn_ids: Tensor, mask: Tensor, n_turns: int) -> Tensor:
    """``[B, U]`` bool: turn ``u`` has at least one valid policy token in trajectory ``b``."""
    valid = (turn_ids >= 0) & mask.bool()
    counts = torch.zeros(turn_ids.shape[0], n_turns, device=turn_ids.device)
    counts.scatter_add_(1, turn_ids.clamp_min(0).long(), valid.float())
    return counts > 0


def checked_turns(inp: AdvantageInput, who: str) -> tuple[Tensor, Tensor]:
    """``(turn_ids as int64 [B, T], exists [B, U])`` for a turn estimator, after the checks
    they all need: a mask, turn ids in ``[-1, U)``, finite signals on existing turns."""
    assert inp.turn_ids is not None and inp.turn_rewards is not None
    if inp.mask is None:
        raise ValueError(f"{who} needs AdvantageInput.mask ([B, T]) with turn_ids")
    tid, U = inp.turn_ids.long(), inp.turn_rewards.shape[1]
    if tid.numel() and (int(tid.min()) < -1 or int(tid.max()) >= U):
        raise ValueError(
            f"turn_ids must be in [-1, U) with U={U} turn_rewards columns, "
            f"got range [{int(tid.min())}, {int(tid.max())}]"
        )
    exists = turn_exists(tid, inp.mask, U)
    if not torch.isfinite(inp.turn_rewards[exists]).all():
        raise ValueError("turn_rewards of existing turns contain NaN or inf")
    return tid, exists


def turn_group_keys(group_ids: Tensor | None, B: int, U: int, device: torch.device) -> Tensor:
    """``[B, U]`` integer key of the (prompt, turn index) group of each turn slot."""
    gid = torch.zeros(B, dtype=torch.long, device=device)
    if group_ids is not None:
        gid = torch.unique(group_ids, return_inverse=True)[1].to(device)
    return gid[:, None] * U + torch.arange(U, device=device)


def turn_group_zscores(
    turn_rewards: Tensor, exists: Tensor, group_ids: Tensor | None, eps: float = 1e-6
) -> TurnZ:
    """Normalise IG within each (prompt, turn index) group, over the trajectories that
    have that turn: z = (IG - mean) / (std + eps), unbiased std; singleton groups -> 0.

    Vectorised: the (group, turn) pairs of existing turns become one flat key, and
    :func:`~rlpost.core.masked.group_stats` computes all groups' statistics at once.
    """
    B, U = turn_rewards.shape
    key = turn_group_keys(group_ids, B, U, turn_rewards.device)
    ig = turn_rewards.float()[exists]  # [N] existing turns only (absent entries unread)
    z = torch.zeros(B, U, device=turn_rewards.device)
    size = torch.zeros(B, U, device=turn_rewards.device)
    if ig.numel():
        s = group_stats(ig, key[exists])
        z[exists] = torch.where(s.count > 1, (ig - s.mean) / (s.std + eps), torch.zeros_like(ig))
        size[exists] = s.count
    return TurnZ(z, exists, size)


def discounted_accumulation(
    z: Tensor, exists: Tensor, gamma: float, rescale: bool = True
) -> Tensor:
    """S_u = sum_{v >= u} gamma^(v-u) z_v over existing turns v, divided (``rescale``) by
    sqrt(sum_{v >= u} gamma^(2(v-u))), the std of S_u when the z_v are independent with
    unit variance (sqrt of the number of terms when gamma = 1). ``[B, U] -> [B, U]``, 0 on
    absent turns.

    No scan: one ``[U, U]`` upper-triangular matrix Wd[u, v] = gamma^(v-u) (v >= u).
    """
    U = z.shape[1]
    idx = torch.arange(U, device=z.device)
    lag = (idx[None, :] - idx[:, None]).float()  # [U, U]: v - u
    upper = lag >= 0
    Wd = torch.where(upper, torch.full_like(lag, gamma).pow(lag.clamp_min(0)), 0.0)
    e = exists.float()
    S = (z * e) @ Wd.T  # [B, U]
    if rescale:
        var = e @ (Wd * Wd).T  # sum of squared weights of the existing terms, >= 1 if exists
        S = S / var.clamp_min(1.0).sqrt()
    return S * e


@dataclass(frozen=True)
class A2TGPOParams:
    gamma: float = 1.0  # discount of later turns' normalised IG, in [0, 1]
    outcome_weight: float = 1.0  # weight of the trajectory's GRPO outcome advantage
    eps_min: float = 0.1  # clip half-width of an uninformative turn (|z| = 0)
    eps_max: float = 0.3  # clip half-width approached as |z| -> inf
    clip_scale: float = 1.0  # s in tanh(|z| / s)
    rescale: bool = True  # False: plain discounted sum (the depth-drifting ablation)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.eps_min <= self.eps_max < 1.0:
            raise ValueError(
                f"need 0 <= eps_min <= eps_max < 1, got eps_min={self.eps_min}, "
                f"eps_max={self.eps_max}"
            )
        if self.clip_scale <= 0:
            raise ValueError(f"clip_scale must be > 0, got {self.clip_scale}")
        if self.outcome_weight < 0:
            raise ValueError(f"outcome_weight must be >= 0, got {self.outcome_weight}")


@ADVANTAGES.register("a2tgpo", A2TGPOParams, reads={Input.TURNS}, coupling=Coupling.GROUP)
def a2tgpo(inp: AdvantageInput, p: A2TGPOParams) -> AdvantageOutput:
    """A²TGPO: turn-group IG normalisation, variance-rescaled accumulation, adaptive
    turn-level clipping (catalog 001-15).

    For trajectory b (prompt g), turn u (inputs ``turn_ids`` ``[B, T]``, ``turn_rewards``
    ``[B, U]``, ``mask`` ``[B, T]``; see the module docstring for absent turns):

        z_{b,u}   = (IG_{b,u} - mean_{g,u} IG) / (std_{g,u} IG + eps)         (i)
                    over the trajectories of prompt g that have turn u; singletons 0
        S_{b,u}   = sum_{v >= u} gamma^(v-u) z_{b,v} / sqrt(sum_{v >= u} gamma^(2(v-u)))
                    over the turns v that b has                                  (ii)
        A_{b,u}   = S_{b,u} + outcome_weight * A^GRPO_b
        eps_{b,u} = eps_min + (eps_max - eps_min) tanh(|z_{b,u}| / s)             (iii)

    ``advantages[b, t] = A_{b, turn_ids[b, t]}`` and ``clip_range[b, t] = eps_{b, turn}``
    on valid policy tokens, 0 elsewhere (masked tokens, ``turn_ids == -1``); consume the
    clip range with the ``ppo_clip_turn`` objective. ``A^GRPO`` is the group-normalised
    outcome reward. Our reading where the abstract is open: the rescaling divides by the
    std the weighted sum would have for independent unit-variance terms, so it equals the
    abstract's sqrt(#terms) at gamma = 1; the clip is symmetric and grows with |z| (an
    unusually large *or* small IG is informative) through a bounded tanh.

    Without ``turn_ids`` / ``turn_rewards`` every z is 0: the outcome term alone (``[B]``
    or ``[B, T]``) with clip range eps_min on valid tokens (metric ``turn_groups`` = 0).
    """
    r = response_rewards(inp)
    outcome = group_normalize(r, inp.group_ids, True, p.eps)  # GRPO on the outcome
    metrics = {"reward_mean": r.mean().item()}
    if (inp.turn_ids is None) != (inp.turn_rewards is None):
        raise ValueError("a2tgpo needs both AdvantageInput.turn_ids and turn_rewards, or neither")
    if inp.turn_ids is None:
        adv = p.outcome_weight * outcome
        clip = None if inp.mask is None else p.eps_min * inp.mask.float()
        metrics |= {"adv_abs_mean": adv.abs().mean().item(), "turn_groups": 0.0}
        return AdvantageOutput(broadcast(adv, inp.mask), clip_range=clip, metrics=metrics)
    tid, exists = checked_turns(inp, "a2tgpo")
    B, U = exists.shape

    tz = turn_group_zscores(inp.turn_rewards, exists, inp.group_ids, p.eps)  # (i)
    acc = discounted_accumulation(tz.z, exists, p.gamma, p.rescale)  # (ii)
    turn_adv = (acc + p.outcome_weight * outcome[:, None]) * exists.float()  # [B, U]
    frac = torch.tanh(tz.z.abs() / p.clip_scale)
    turn_clip = (p.eps_min + (p.eps_max - p.eps_min) * frac) * exists.float()  # (iii)

    valid = (tid >= 0) & inp.mask.bool()  # [B, T] policy tokens
    at = tid.clamp_min(0)
    adv_tok = torch.where(valid, turn_adv.gather(1, at), 0.0)
    clip_tok = torch.where(valid, turn_clip.gather(1, at), 0.0)
    n_turns = exists.sum().clamp_min(1)
    keys = turn_group_keys(inp.group_ids, B, U, exists.device)[exists]
    metrics |= {
        "adv_abs_mean": (turn_adv.abs().sum() / n_turns).item(),
        "turn_groups": float(torch.unique(keys).numel()),
        "turns_per_traj": exists.float().sum(1).mean().item(),
        "ig_z_abs_mean": (tz.z.abs().sum() / n_turns).item(),
        "clip_range_mean": (turn_clip.sum() / n_turns).item(),
    }
    return AdvantageOutput(adv_tok, clip_range=clip_tok, metrics=metrics)
