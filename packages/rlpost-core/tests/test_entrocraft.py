"""Entrocraft (catalog 001-28): rejection of advantages to follow an entropy schedule."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, RegistryError, TrainingDynamics, get_preset

SQ3_2 = math.sqrt(3) / 2  # GRPO advantage of rewards [1, 1, 0, 0]: +-0.5 / sqrt(1/3)


def dyn(entropy, initial=2.0, progress=0.0):
    return TrainingDynamics(progress=progress, entropy=entropy, initial_entropy=initial)


def hand_input(entropy):
    # one group; log-probs per response (T = 1): mean -2, deviations [+1, -1, +1, -1]
    return AdvantageInput(
        torch.tensor([1.0, 1.0, 0.0, 0.0]),
        torch.zeros(4, dtype=torch.long),
        logprobs=torch.tensor([[-1.0], [-3.0], [-1.0], [-3.0]]),
        dynamics=dyn(entropy),
    )


def test_hand_values_below_and_above_target():
    # A = [+s, +s, -s, -s] (s = sqrt(3)/2), l - mean l = [1, -1, 1, -1]
    # -> c = [+s, -s, -s, +s]. Target = 1.0 * 2.0 = 2.0 at progress 0; gain 1e3 -> q = 1.
    # H = 1 < 2: reject c > 0 (responses 0 and 3, which lower the entropy);
    # H = 3 > 2: reject c < 0 (responses 1 and 2, which raise it).
    build = ADVANTAGES.build("entrocraft", gain=1e3)
    below = build(hand_input(1.0))
    assert_close(below.advantages, torch.tensor([0.0, SQ3_2, -SQ3_2, 0.0]))
    assert below.metrics["entrocraft_rejected_frac"] == 0.5
    above = build(hand_input(3.0))
    assert_close(above.advantages, torch.tensor([SQ3_2, 0.0, 0.0, -SQ3_2]))


def test_target_schedule_and_rejection_probability():
    # start 1.0 -> end 0.5 at progress 0.5: 0.75 x H0 = 1.5 nats; H = 1.2:
    # q = gain * |1.5 - 1.2| / 1.5 = 0.2 * gain, capped by p_max
    inp = AdvantageInput(
        torch.tensor([1.0, 0.0]),
        logprobs=torch.tensor([[-1.0], [-2.0]]),
        dynamics=dyn(1.2, progress=0.5),
    )
    m = ADVANTAGES("entrocraft", inp, end=0.5, gain=2.0).metrics
    assert m["entrocraft_target"] == pytest.approx(1.5)
    assert m["entrocraft_reject_prob"] == pytest.approx(0.4)
    m = ADVANTAGES("entrocraft", inp, end=0.5, gain=2.0, p_max=0.25).metrics
    assert m["entrocraft_reject_prob"] == pytest.approx(0.25)
    # absolute schedule: start / end in nats, initial_entropy not needed
    inp_abs = AdvantageInput(
        inp.rewards,
        logprobs=inp.logprobs,
        dynamics=TrainingDynamics(progress=1.0, entropy=1.0),
    )
    m = ADVANTAGES("entrocraft", inp_abs, absolute=True, start=3.0, end=1.25).metrics
    assert m["entrocraft_target"] == pytest.approx(1.25)


def random_batch(seed, entropy, B=256, G=8, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths[:, None]).float()
    return AdvantageInput(
        torch.bernoulli(torch.full((B,), 0.4), generator=g),
        torch.arange(B) // G,
        mask,
        logprobs=-torch.rand(B, T, generator=g) * 3 * mask,
        dynamics=dyn(entropy),
    )


def cov_terms(inp, adv):
    """c_i = (l_i - mean_g l) * A_i per response, recomputed here from the inputs;
    the predicted entropy change is dH ~ -eta * mean(c)."""
    m = inp.mask
    lp = (inp.logprobs * m).sum(1) / m.sum(1)
    a = (adv * m).sum(1) / m.sum(1)
    same = (inp.group_ids[:, None] == inp.group_ids[None, :]).float()
    return (lp - same @ lp / same.sum(1)) * a


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_moves_predicted_entropy_change_toward_target(seed):
    base = ADVANTAGES("grpo", random_batch(seed, 1.0)).advantages
    for entropy, sign in ((1.0, +1), (3.0, -1)):  # below / above the target 2.0
        inp = random_batch(seed, entropy)
        cov0 = cov_terms(inp, base).mean()
        for gain in (0.5, 1e3):
            c = cov_terms(inp, ADVANTAGES("entrocraft", inp, gain=gain).advantages)
            # predicted dH = -eta * mean(c): below target it must rise, above it must fall
            assert sign * (cov0 - c.mean()) > 0
            if gain > 1:  # q = 1: every remaining response pushes the entropy the right way
                assert (sign * c <= 1e-7).all()


def softmax_entropy(theta):
    lp = theta.log_softmax(-1)
    return -(lp.exp() * lp).sum().item()


@pytest.mark.parametrize("seed", range(5))
def test_one_policy_gradient_step_on_a_softmax_bandit(seed):
    # exact entropy after one sampled policy-gradient step on K logits:
    # theta += eta / N * sum_i A_i (e_{a_i} - pi)
    torch.manual_seed(seed)
    K, N, eta = 20, 64, 0.5
    theta = torch.randn(K)
    q = torch.rand(K)  # Bernoulli success probability of each arm
    pi = theta.softmax(-1)
    a = torch.multinomial(pi, N, replacement=True)
    r = torch.bernoulli(q[a])
    lp = pi.log()[a][:, None]
    H = softmax_entropy(theta)

    def step(adv):
        grad = torch.zeros(K).index_add_(0, a, adv) - pi * adv.sum()
        return softmax_entropy(theta + eta / N * grad)

    h_base = step(ADVANTAGES("grpo", AdvantageInput(r)).advantages)
    for target_frac, sign in ((1.5, +1), (0.5, -1)):  # target above / below the current H
        inp = AdvantageInput(r, logprobs=lp, dynamics=dyn(H, initial=H))
        adv = ADVANTAGES("entrocraft", inp, start=target_frac, end=target_frac, gain=1e3)
        assert sign * (step(adv.advantages) - h_base) > 0


def train_bandit(estimator, steps=150, P=4, K=50, G=16, lr=1.0, seed=0):
    """Softmax bandits (P prompts x K Bernoulli arms) trained from uniform logits with the
    exact sampled policy-gradient step; returns the mean entropy before each step."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(P, K, generator=g, dtype=torch.float64)
    theta = torch.zeros(P, K, dtype=torch.float64)
    h0, hs = math.log(K), []
    for t in range(steps):
        pi = theta.softmax(-1)
        arms = torch.multinomial(pi, G, replacement=True, generator=g)  # [P, G]
        r = torch.bernoulli(q.gather(1, arms), generator=g).flatten().float()
        lp = pi.log().gather(1, arms).reshape(-1, 1).float()
        hs.append(softmax_entropy(theta) / P)
        dyn_t = TrainingDynamics(t / (steps - 1), entropy=hs[-1], initial_entropy=h0)
        inp = AdvantageInput(r, torch.arange(P).repeat_interleave(G), logprobs=lp, dynamics=dyn_t)
        adv = estimator(inp).advantages.double().reshape(P, G)
        grad = torch.zeros_like(theta).scatter_add_(1, arms, adv) - pi * adv.sum(1, keepdim=True)
        theta += lr / G * grad
    return torch.tensor(hs), h0


def test_entropy_tracks_a_linear_anneal_on_a_softmax_bandit():
    # schedule 1.0 -> 0.7 x H0; plain GRPO collapses the entropy, Entrocraft follows H*
    target = torch.linspace(1.0, 0.7, 150).double() * math.log(50)
    h_grpo, h0 = train_bandit(ADVANTAGES.build("grpo"))
    h_ec, _ = train_bandit(ADVANTAGES.build("entrocraft", end=0.7, gain=50.0))
    assert (h_grpo - target).abs().mean() / h0 > 0.15  # 0.23 when written
    err = (h_ec - target).abs() / h0
    assert err.mean() < 0.03 and err.max() < 0.06  # 0.014 and 0.033 when written


def test_at_target_returns_exactly_the_base_estimator():
    inp = random_batch(0, entropy=2.0)  # H == H* = 1.0 x 2.0
    out = ADVANTAGES("entrocraft", inp, gain=1e3)
    assert torch.equal(out.advantages, ADVANTAGES("grpo", inp).advantages)
    assert out.metrics["entrocraft_rejected_frac"] == 0.0
    out = ADVANTAGES("entrocraft", inp, base="rloo")  # estimator-agnostic
    assert torch.equal(out.advantages, ADVANTAGES("rloo", inp).advantages)
    out = ADVANTAGES("entrocraft", inp, base_params={"scale_by_std": False})
    assert torch.equal(out.advantages, ADVANTAGES("grpo", inp, scale_by_std=False).advantages)


def test_deterministic_given_seed_and_progress_and_no_global_rng():
    # constant target 2.0 (start = end), H = 1.5: q = 2 * 0.5 / 2.0 = 0.5
    kw = {"gain": 2.0, "start": 1.0, "end": 1.0}

    def run(progress, seed):
        inp = random_batch(3, entropy=1.5)
        inp = AdvantageInput(
            inp.rewards,
            inp.group_ids,
            inp.mask,
            logprobs=inp.logprobs,
            dynamics=dyn(1.5, 2.0, progress),
        )
        return ADVANTAGES("entrocraft", inp, seed=seed, **kw)

    state = torch.get_rng_state()
    a = run(0.25, 7)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.metrics["entrocraft_reject_prob"] == pytest.approx(0.5)
    assert torch.equal(a.advantages, run(0.25, 7).advantages)
    assert not torch.equal(a.advantages, run(0.25, 8).advantages)  # another seed
    assert not torch.equal(a.advantages, run(0.5, 7).advantages)  # another step


def test_masked_tokens_are_ignored_and_rows_rejected_whole():
    inp = random_batch(1, entropy=1.0)
    garbage = inp.logprobs + 50.0 * (1 - inp.mask)  # padding log-probs must not matter
    noisy = AdvantageInput(
        inp.rewards, inp.group_ids, inp.mask, logprobs=garbage, dynamics=inp.dynamics
    )
    a = ADVANTAGES("entrocraft", inp, gain=1e3).advantages
    assert torch.equal(a, ADVANTAGES("entrocraft", noisy, gain=1e3).advantages)
    for fill in (-math.inf, math.nan):  # pad log-probs as engines leave them: -inf / NaN
        padded = AdvantageInput(
            inp.rewards,
            inp.group_ids,
            inp.mask,
            logprobs=inp.logprobs.masked_fill(inp.mask == 0, fill),
            dynamics=inp.dynamics,
        )
        out = ADVANTAGES("entrocraft", padded, gain=1e3)
        assert torch.equal(out.advantages, a), fill
        assert all(math.isfinite(v) for v in out.metrics.values()), fill
    assert (a[inp.mask == 0] == 0).all()
    base = ADVANTAGES("grpo", inp).advantages
    kept = (a != 0).any(1)
    assert torch.equal(a[kept], base[kept])  # kept rows unchanged, rejected rows all zero
    assert 0 < int(kept.sum()) < inp.rewards.shape[0]


def test_validation_errors():
    inp = hand_input(1.0)
    no_lp = AdvantageInput(inp.rewards, inp.group_ids, dynamics=inp.dynamics)
    with pytest.raises(
        ValueError, match=r"'entrocraft' needs behaviour_logprobs \(AdvantageInput\.logprobs\)"
    ):
        ADVANTAGES("entrocraft", no_lp)
    no_dyn = AdvantageInput(inp.rewards, inp.group_ids, logprobs=inp.logprobs)
    with pytest.raises(
        ValueError, match=r"'entrocraft' needs dynamics \(AdvantageInput\.dynamics\)"
    ):
        ADVANTAGES("entrocraft", no_dyn)
    no_h0 = AdvantageInput(
        inp.rewards, logprobs=inp.logprobs, dynamics=TrainingDynamics(entropy=1.0)
    )
    with pytest.raises(ValueError, match="initial_entropy"):
        ADVANTAGES("entrocraft", no_h0)
    for kw, msg in (
        ({"p_max": 1.5}, "p_max"),
        ({"gain": -1.0}, "gain"),
        ({"end": 0.0}, "start and end"),
        ({"base": "entrocraft"}, "base cannot"),
        ({"base": "nope"}, "unknown advantage estimator 'nope'"),
        ({"base_params": {"scale_by_stdd": True}}, r"unknown parameter\(s\) \['scale_by_stdd'\]"),
    ):
        with pytest.raises(RegistryError, match=msg):
            ADVANTAGES.build("entrocraft", **kw)


def test_preset_builds():
    p = get_preset("entrocraft")
    assert p.catalog_id == "001-28" and "no numbers" in p.notes
    assert p.build().advantage.params.end == 0.8
