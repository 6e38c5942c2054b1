"""The standard advantage estimators: GRPO / Dr. GRPO, RLOO, REINFORCE++, GAE."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlpost.core.advantages.base import (
    ADVANTAGES,
    AdvantageInput,
    AdvantageOutput,
    _metrics,
    broadcast,
    group_normalize,
    response_rewards,
    reward_to_go,
    scalarize_rewards,
    token_reward_matrix,
)
from rlpost.core.contract import Coupling, Input
from rlpost.core.masked import group_stats, masked_whiten
from rlpost.core.registry import NoParams


@dataclass(frozen=True)
class GRPOParams:
    scale_by_std: bool = True  # False: Dr. GRPO's unscaled r - mean
    eps: float = 1e-6
    clip: float | None = None  # |A| bound (Flow-GRPO clips to 5); None: unbounded

    def __post_init__(self) -> None:
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0 (or None), got {self.clip}")


@ADVANTAGES.register("grpo", GRPOParams, coupling=Coupling.GROUP)
def grpo(inp: AdvantageInput, p: GRPOParams) -> AdvantageOutput:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)   with std the unbiased group std and
    r_i the outcome plus any in-reward token penalties summed over the response,
    or A_i = r_i - mean_g(r) when ``scale_by_std=False`` (Dr. GRPO, Liu et al. 2025,
    arXiv:2503.20783, which drops the std to remove the question-difficulty bias).
    A group with identical rewards has r_i - mean = 0 exactly, so A = 0 (no NaN).
    ``clip``: A clipped to [-clip, clip] (Flow-GRPO, Liu et al. 2025, arXiv:2505.05470: 5).
    """
    r = response_rewards(inp)
    adv = group_normalize(r, inp.group_ids, p.scale_by_std, p.eps)
    if p.clip is not None:
        adv = adv.clamp(-p.clip, p.clip)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@ADVANTAGES.register("rloo", NoParams, coupling=Coupling.GROUP)
def rloo(inp: AdvantageInput, p: NoParams) -> AdvantageOutput:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = r_i - (1/(n-1)) sum_{j != i} r_j = n/(n-1) * (r_i - mean_g(r)),  n = group size;
    a singleton group (n = 1) has no baseline sample and gets A = 0.
    """
    r = response_rewards(inp)
    s = group_stats(r, inp.group_ids)
    adv = torch.where(s.count > 1, s.count / (s.count - 1).clamp_min(1) * (r - s.mean), 0.0 * r)
    return AdvantageOutput(broadcast(adv, inp.mask), metrics=_metrics(adv, r))


@dataclass(frozen=True)
class ReinforcePPParams:
    subtract_group_mean: bool = False  # True: "REINFORCE++-baseline" (group mean first)
    gamma: float = 1.0
    eps: float = 1e-8


@ADVANTAGES.register("reinforce_pp", ReinforcePPParams, coupling=Coupling.BATCH)
def reinforce_pp(inp: AdvantageInput, p: ReinforcePPParams) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): critic-free, *batch*-normalised advantage.

    Per token, the return G_t = sum_{s>=t} gamma^(s-t) r_s of the dense reward (outcome at
    the last token + ``token_rewards`` such as -beta*KL), optionally minus the group mean
    outcome (REINFORCE++-baseline), then whitened over all valid tokens of the batch:
    A = (G - mean_batch(G)) / (std_batch(G) + eps). Without a mask: the same on ``[B]``.
    """
    r = scalarize_rewards(inp)
    if p.subtract_group_mean:
        r = r - group_stats(r, inp.group_ids).mean
    if inp.mask is None:
        return AdvantageOutput(masked_whiten(r, None, eps=p.eps), metrics=_metrics(r, r))
    shifted = AdvantageInput(r, inp.group_ids, inp.mask, token_rewards=inp.token_rewards)
    returns = reward_to_go(token_reward_matrix(shifted), inp.mask, p.gamma)
    adv = masked_whiten(returns, inp.mask, eps=p.eps)
    return AdvantageOutput(adv, returns=returns, metrics=_metrics(adv, r))


@dataclass(frozen=True)
class GAEParams:
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True


@ADVANTAGES.register(
    "gae",
    GAEParams,
    needs={Input.MASK, Input.VALUES},
    coupling=Coupling.BATCH,
)
def gae(inp: AdvantageInput, p: GAEParams) -> AdvantageOutput:
    """Generalised advantage estimation for PPO with a critic (Schulman et al. 2016).

    delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t
    A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1},     returns_t = A_t + V_t
    with r_t the dense reward (outcome on the last valid token + ``token_rewards``) and
    m the mask (V past the last valid token is 0). Optionally whitened over valid tokens.
    Needs ``mask`` and ``values`` ``[B, T]``.
    """
    if inp.mask is None or inp.values is None:
        raise ValueError("gae needs AdvantageInput.mask and AdvantageInput.values ([B, T])")
    m = inp.mask.float()
    v = inp.values.float().detach() * m
    r = token_reward_matrix(inp)
    B, T = m.shape
    next_v = torch.cat([v[:, 1:], v.new_zeros(B, 1)], dim=1)
    next_m = torch.cat([m[:, 1:], m.new_zeros(B, 1)], dim=1)
    delta = r + p.gamma * next_v * next_m - v
    adv = torch.zeros_like(v)
    running = v.new_zeros(B)
    for t in range(T - 1, -1, -1):  # loop over time, vectorised over batch
        running = delta[:, t] + p.gamma * p.lam * next_m[:, t] * running
        adv[:, t] = running
    adv = adv * m
    returns = (adv + v) * m
    if p.whiten:
        adv = masked_whiten(adv, m)
    return AdvantageOutput(adv, returns=returns, metrics=_metrics(adv, scalarize_rewards(inp)))
