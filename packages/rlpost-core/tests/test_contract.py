"""One contract test per registry, parametrised over every registered name.

New entries get these checks for free: output type, shapes, finiteness, and masked
tokens receive exactly zero gradient. Entries needing extra inputs get them from
the shared fixtures below.
"""

import pytest
import torch

from rlpost.core import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    KL_ESTIMATORS,
    OBJECTIVES,
    PREFERENCE_LOSSES,
    RATIOS,
    AdvantageInput,
    AdvantageOutput,
    AggregationInput,
    KLInput,
    ObjectiveInput,
    PreferenceInput,
    RatioInput,
    TrainingDynamics,
)
from rlpost.core.ratios import TokenDistributions

B, T = 6, 5
REQUIRED = {("aggregation", "constant"): {"normalizer": 5.0}}
NEEDS_MASK = {"gae", "hmpo", "icr", "ed_grpo", "entrocraft", "a2tgpo"}  # read [B, T] inputs
VECTOR_REWARD = {"vpo", "rdpo"}  # estimators of [B, K] rewards
FITS_TARGET = {"hard_pair_grpo"}  # objectives that fit pi to a target ratio (restoring)
# off-policy anchors (KL(mu || pi) / ESS regulariser) that pull back to pi_old, 0 there
FITS_TARGET |= {"implicit_pessimism", "ess_adaptive"}
FITS_GROUP_TARGET = {"lpo"}  # fit a group's sequence-ratio softmax to a target (restoring)
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])  # ObjectiveInput.group_ids for group-level entries


def mask() -> torch.Tensor:
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    return (torch.arange(T) < lengths[:, None]).float()


def logps(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = (logp.detach() + 0.1 * torch.randn(B, T, generator=g)).clamp(max=0)
    return logp, old


@pytest.mark.parametrize("name", ADVANTAGES.names())
@pytest.mark.parametrize("masked", [False, True])
def test_advantage_contract(name, masked):
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # group 1 (ids 1) is degenerate
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    m = mask()
    if name in VECTOR_REWARD:
        rewards = torch.stack([rewards, torch.tensor([0.5, 0.2, 0.1, 0.3, 0.3, 0.3])], 1)
    token_inputs = {
        "values": torch.randn(B, T),
        "logprobs": -torch.rand(B, T) * m,  # behaviour log-probs
        "turn_ids": torch.zeros(B, T, dtype=torch.long),  # one turn per trajectory
    }
    inp = AdvantageInput(
        rewards,
        groups,
        m if masked else None,
        **(token_inputs if masked else {}),
        features=torch.randn(B, 4),
        turn_rewards=torch.randn(B, 1),
        dynamics=TrainingDynamics(progress=0.5, entropy=0.8, initial_entropy=1.0),
    )
    if name in NEEDS_MASK and not masked:  # these read response lengths / token values
        with pytest.raises(ValueError, match=f"{name} needs"):
            ADVANTAGES.build(name)(inp)
        return
    out = ADVANTAGES.build(name)(inp)
    assert isinstance(out, AdvantageOutput)
    assert out.advantages.shape == ((B, T) if masked else (B,))
    assert torch.isfinite(out.advantages).all()
    if masked:
        assert (out.advantages[m == 0] == 0).all()
    assert all(isinstance(v, float) for v in out.metrics.values())


def _zero_grad_on_mask(loss: torch.Tensor, x: torch.Tensor, m: torch.Tensor) -> None:
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    assert g is not None and torch.isfinite(g).all()
    assert (g[m == 0] == 0).all(), "masked tokens must get exactly zero gradient"


@pytest.mark.parametrize("name", RATIOS.names())
def test_ratio_contract(name):
    logp, old = logps()
    m = mask()
    out = RATIOS.build(name)(RatioInput(logp, old, m))
    assert out.log_ratio.shape == (B, T) and torch.isfinite(out.log_ratio).all()
    assert (out.log_ratio[m == 0] == 0).all()
    _zero_grad_on_mask(out.log_ratio.sum(), logp, m)


@pytest.mark.parametrize("name", CORRECTIONS.names())
def test_correction_contract(name):
    logp, old = logps()
    m = mask()
    # optional inputs some corrections read (predictive_divergence_mask), ignored by others
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(B, T, 7, generator=g)
    tokens = torch.randint(0, 7, (B, T), generator=g)
    dists = TokenDistributions.from_logits(
        logits, logits + torch.randn(B, T, 7, generator=g), tokens
    )
    out = CORRECTIONS.build(name)(
        RatioInput(logp, old, m, rollout_logp=old + 0.05, advantages=torch.randn(B), dists=dists)
    )
    assert out.weights.shape == out.mask.shape == (B, T)
    assert not out.weights.requires_grad, "corrections must be detached"
    assert (out.weights[m == 0] == 0).all() and (out.mask[m == 0] == 0).all()
    assert (out.weights >= 0).all() and torch.isfinite(out.weights).all()


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_objective_contract(name):
    logp, old = logps()
    m = mask()
    adv = torch.randn(B)
    out = OBJECTIVES.build(name)(ObjectiveInput(logp, old, adv, m, group_ids=GROUPS))
    assert out.loss.shape == (B, T) and torch.isfinite(out.loss).all()
    assert (out.loss[m == 0] == 0).all()
    assert all(isinstance(v, float) for v in out.metrics.values())
    _zero_grad_on_mask(out.loss.sum(), logp, m)


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_objective_zero_advantage_gives_zero_gradient(name):
    logp, old = logps()
    zero = torch.zeros(B)
    out = OBJECTIVES.build(name)(ObjectiveInput(logp, old, zero, mask(), group_ids=GROUPS))
    (g,) = torch.autograd.grad(out.loss.sum(), logp)
    if name in FITS_TARGET | FITS_GROUP_TARGET:
        # a fitted target of log-ratio 0: no push at the old policy, a pull back to it
        # off-policy (never away from it; per token, or in sum for a group-level target)
        pull = g * (logp.detach() - old)
        assert (pull.sum() >= 0) if name in FITS_GROUP_TARGET else (pull >= 0).all()
        at_old = old.clone().requires_grad_(True)
        inp = ObjectiveInput(at_old, old, zero, mask(), group_ids=GROUPS)
        out = OBJECTIVES.build(name)(inp)
        (g,) = torch.autograd.grad(out.loss.sum(), at_old)
    assert (g == 0).all()


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_aggregation_contract(name):
    logp, _ = logps()
    m = mask()
    out = AGGREGATIONS.build(name, **REQUIRED.get(("aggregation", name), {}))(
        AggregationInput(logp * 2, m)
    )
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    _zero_grad_on_mask(out.loss, logp, m)


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_contract(name):
    logp, old = logps()
    m = mask()
    adv = torch.randn(B)  # read by response-weighted KLs (reva_rer), ignored by the others
    out = KL_ESTIMATORS.build(name)(KLInput(logp, old, m, advantages=adv))
    assert out.kl.shape == (B, T) and torch.isfinite(out.kl).all()
    assert (out.kl[m == 0] == 0).all()
    _zero_grad_on_mask(out.kl.sum(), logp, m)
    same = KL_ESTIMATORS.build(name)(KLInput(old, old, m, advantages=adv)).kl
    assert (same == 0).all(), "KL of a policy with itself is 0"


@pytest.mark.parametrize("name", PREFERENCE_LOSSES.names())
def test_preference_contract(name):
    c = (-torch.rand(B) * 20).requires_grad_(True)
    r = (-torch.rand(B) * 20).requires_grad_(True)
    out = PREFERENCE_LOSSES.build(name)(
        PreferenceInput(
            c, r, c.detach() + 1, r.detach() - 1, torch.full((B,), 7), torch.full((B,), 9)
        )
    )
    assert out.loss.shape == out.chosen_reward.shape == out.rejected_reward.shape == (B,)
    assert torch.isfinite(out.loss).all() and not out.chosen_reward.requires_grad
    gc, gr = torch.autograd.grad(out.loss.sum(), (c, r))
    # every preference loss pushes chosen up and rejected down (or is at its optimum);
    # xi-DPO's squared distance to its margin does so only below the margin xi = 0.2
    # and pulls the pair back together above it
    below = torch.ones(B, dtype=torch.bool)
    if name == "xi_dpo":
        below = 1 - (c.detach() / 7) / (r.detach() / 9) < 0.2
        assert (gc[~below] >= 0).all() and (gr[~below] <= 0).all()
    assert (gc[below] <= 0).all() and (gr[below] >= 0).all()
