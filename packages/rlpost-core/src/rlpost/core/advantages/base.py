"""Advantage estimators: rewards (scalar or vector), groups, masks, values -> advantages.

Every entry has the signature ``fn(AdvantageInput, params) -> AdvantageOutput``.

Shapes: ``B`` responses, ``T`` response tokens, ``K`` reward components.

* ``rewards``: ``[B]`` or ``[B, K]``. Vector rewards are reduced by
  :func:`scalarize_rewards` (weighted sum, ``reward_weights`` default all ones) unless an
  estimator consumes the vector itself.
* ``group_ids``: ``[B]`` integer prompt labels (responses sharing a prompt share a label).
* ``mask``: ``[B, T]`` response-token mask. When given, outputs are per token ``[B, T]``
  (a response-level advantage broadcast over its valid tokens, 0 on masked tokens);
  without it they are per response ``[B]``.
* ``token_rewards``: optional ``[B, T]`` dense rewards (e.g. ``-beta * KL`` in the reward,
  see :func:`rlpost.core.kl.kl_reward_penalty`), added to the outcome reward that sits on
  each response's last valid token.
* ``values``: ``[B, T]`` critic values V(s_t) for GAE.
* ``logprobs``: optional ``[B, T]`` behaviour log-probs of the sampled tokens (EDO's
  self-information bonus, Entrocraft's covariance rule).
* ``prompt_features`` / ``completion_features``: optional ``[B, D]`` embeddings of each
  row's prompt (BASIS's cross-prompt value estimate) or of its completion (GCPO's
  semantic disagreement).
* ``reward_mask``: optional ``[B, K]`` bool, which reward components apply to a response
  (RDPO's active reward subspaces in multi-task batches); inactive entries are ignored.
* ``turn_ids`` / ``turn_rewards``: optional ``[B, T]`` turn index of each token (-1: not a
  policy token) and ``[B, U]`` per-turn intrinsic signals (A²TGPO's information gain, a
  rubric judge's score of each turn); ``turn_stages``: optional ``[B, U]`` the stage each
  turn belongs to (RubricEM's research / answer stages; ``None``: no stage structure).
* ``dynamics``: optional :class:`TrainingDynamics` (progress, current and initial policy
  entropy) for schedule-driven estimators (Entrocraft, FADE).
* ``teacher_logprobs``: optional ``[B, T]`` a teacher's log-probs of the sampled tokens
  (StepOPSD's hindsight self-teacher; with ``logprobs``, the student's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlpost.core.contract import Input
from rlpost.core.masked import group_stats
from rlpost.core.registry import Registry


@dataclass(frozen=True)
class TrainingDynamics:
    """Scalars of the training run that schedule-driven estimators read.

    ``progress``: fraction of training done, in [0, 1]. ``entropy``: the current mean token
    entropy of the policy (nats). ``initial_entropy``: the same at the start of training.
    """

    progress: float = 0.0
    entropy: float | None = None
    initial_entropy: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.progress <= 1.0:
            raise ValueError(f"progress must be in [0, 1], got {self.progress}")
        for name in ("entropy", "initial_entropy"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite entropy >= 0, got {v}")


@dataclass(frozen=True)
class AdvantageInput:
    rewards: Tensor
    group_ids: Tensor | None = None
    mask: Tensor | None = None
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    reward_weights: Tensor | None = None
    logprobs: Tensor | None = None
    prompt_features: Tensor | None = None
    completion_features: Tensor | None = None
    reward_mask: Tensor | None = None
    turn_ids: Tensor | None = None
    turn_rewards: Tensor | None = None
    turn_stages: Tensor | None = None
    dynamics: TrainingDynamics | None = None
    teacher_logprobs: Tensor | None = None

    def __post_init__(self) -> None:
        r = self.rewards
        if r.dim() not in (1, 2):
            raise ValueError(f"rewards must be [B] or [B, K], got shape {tuple(r.shape)}")
        B = r.shape[0]
        for name in ("mask", "values", "token_rewards", "logprobs", "turn_ids", "teacher_logprobs"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[0] != B):
                raise ValueError(f"{name} must be [B={B}, T], got shape {tuple(t.shape)}")
            if t is not None and self.mask is not None and t.shape != self.mask.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != mask {tuple(self.mask.shape)}")
        for name in ("prompt_features", "completion_features", "turn_rewards"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 2 or t.shape[0] != B):
                raise ValueError(f"{name} must be [B={B}, D], got shape {tuple(t.shape)}")
        if self.turn_stages is not None and (
            self.turn_rewards is None or self.turn_stages.shape != self.turn_rewards.shape
        ):
            raise ValueError("turn_stages must be [B, U], the shape of turn_rewards")
        if self.reward_mask is not None and (r.dim() != 2 or self.reward_mask.shape != r.shape):
            raise ValueError(
                f"reward_mask must match [B, K] rewards {tuple(r.shape)}, "
                f"got {tuple(self.reward_mask.shape)}"
            )
        if self.group_ids is not None and tuple(self.group_ids.shape) != (B,):
            raise ValueError(f"group_ids must be [B={B}], got {tuple(self.group_ids.shape)}")
        if self.reward_weights is not None and (
            r.dim() != 2 or self.reward_weights.shape != (r.shape[1],)
        ):
            raise ValueError("reward_weights must be [K] and rewards [B, K]")
        finite = torch.isfinite(r)
        if self.reward_mask is not None:
            finite = finite | ~self.reward_mask.bool()  # inactive entries may hold NaN
        if not finite.all():
            raise ValueError("rewards contain NaN or inf")


@dataclass(frozen=True)
class AdvantageOutput:
    advantages: Tensor  # [B, T] when a mask was given, else [B]
    returns: Tensor | None = None  # [B, T] value targets (GAE)
    clip_range: Tensor | None = None  # [B, T] per-token clip half-width (A²TGPO)
    metrics: dict[str, float] = field(default_factory=dict)


ADVANTAGES: Registry[AdvantageInput, AdvantageOutput] = Registry(
    "advantage estimator",
    AdvantageInput,
    AdvantageOutput,
    inputs={
        Input.MASK: ("mask",),
        Input.VALUES: ("values",),
        Input.VECTOR_REWARDS: ("reward_mask",),
        Input.BEHAVIOUR_LOGPROBS: ("logprobs",),
        Input.PROMPT_FEATURES: ("prompt_features",),
        Input.COMPLETION_FEATURES: ("completion_features",),
        Input.TURNS: ("turn_ids", "turn_rewards"),
        Input.DYNAMICS: ("dynamics",),
        Input.TEACHER_LOGPROBS: ("teacher_logprobs",),
    },
    # the mask is always passed (it sets the output's shape); an entry declares it only
    # when it cannot do without it
    gated=(
        Input.VALUES,
        Input.VECTOR_REWARDS,
        Input.BEHAVIOUR_LOGPROBS,
        Input.PROMPT_FEATURES,
        Input.COMPLETION_FEATURES,
        Input.TURNS,
        Input.DYNAMICS,
        Input.TEACHER_LOGPROBS,
    ),
    present={Input.VECTOR_REWARDS: lambda inp: inp.rewards.dim() == 2},
    describe={
        Input.VECTOR_REWARDS: "AdvantageInput.rewards as [B, K] components, optionally "
        "reward_weights [K] and reward_mask [B, K]"
    },
)


def scalarize_rewards(inp: AdvantageInput) -> Tensor:
    """``[B, K] -> [B]`` weighted sum (weights default to 1); ``[B]`` passes through."""
    r = inp.rewards
    if r.dim() == 1:
        return r.float()
    if inp.reward_mask is not None:  # inactive components count as 0
        r = torch.where(inp.reward_mask.bool(), r, torch.zeros_like(r))
    w = inp.reward_weights if inp.reward_weights is not None else r.new_ones(r.shape[1])
    return r.float() @ w.to(r.device, torch.float32)


def response_rewards(inp: AdvantageInput) -> Tensor:
    """Scalar reward per response ``[B]``: the (scalarised) outcome plus the sum of the
    dense ``token_rewards`` over valid tokens (e.g. r - beta * sum_t KL_t, as in RLOO's
    KL-in-reward), so response-level estimators do not silently drop in-reward penalties."""
    r = scalarize_rewards(inp)
    if inp.token_rewards is not None:
        m = inp.mask.float() if inp.mask is not None else torch.ones_like(inp.token_rewards)
        r = r + (inp.token_rewards.float() * m).sum(1)
    return r


def last_token_index(mask: Tensor) -> Tensor:
    """Index of each row's last valid token, ``[B]`` (0 for an empty row)."""
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), pos, torch.zeros_like(pos)).amax(dim=1)


def token_reward_matrix(inp: AdvantageInput) -> Tensor:
    """Dense ``[B, T]`` rewards: outcome reward at the last valid token + ``token_rewards``."""
    assert inp.mask is not None
    m = inp.mask.float()
    r = torch.zeros_like(m)
    r.scatter_(1, last_token_index(inp.mask).unsqueeze(1), scalarize_rewards(inp).unsqueeze(1))
    if inp.token_rewards is not None:
        r = r + inp.token_rewards.float()
    return r * m


def broadcast(adv: Tensor, mask: Tensor | None) -> Tensor:
    """``[B] -> [B, T]`` over valid tokens when a mask is given."""
    return adv if mask is None else adv.unsqueeze(1) * mask.to(adv.dtype)


def reward_to_go(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = sum_{s >= t} gamma^(s-t) r_s over valid tokens, ``[B, T]`` (reverse scan over T)."""
    m = mask.to(rewards.dtype)
    if gamma == 1.0 and bool((m[:, 1:] <= m[:, :-1]).all()):
        # undiscounted, right-padded rows: a reverse cumulative sum, no loop over time
        return (rewards * m).flip(1).cumsum(1).flip(1) * m
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):  # loop over time, vectorised over batch
        running = rewards[:, t] + gamma * running * (m[:, t + 1] if t + 1 < m.shape[1] else 0.0)
        out[:, t] = running * m[:, t]
    return out


def group_normalize(x: Tensor, group_ids: Tensor | None, scale_by_std: bool, eps: float) -> Tensor:
    """``x - mean_g(x)``, divided by ``std_g(x) + eps`` when ``scale_by_std`` (GRPO's
    normalisation of any per-response score ``[B]``); equal scores give exactly 0."""
    s = group_stats(x, group_ids)
    adv = x - s.mean
    return adv / (s.std + eps) if scale_by_std else adv


def _metrics(adv: Tensor, rewards: Tensor) -> dict[str, float]:
    return {"reward_mean": rewards.mean().item(), "adv_abs_mean": adv.abs().mean().item()}
