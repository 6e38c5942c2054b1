"""FADE (catalog 004-21): sign x difficulty decomposition with an entropy-driven focal schedule."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlpost.core import ADVANTAGES, AdvantageInput, RegistryError, TrainingDynamics, get_preset
from rlpost.core.advantages.entropy import fade_decompose, fade_phase

S = math.sqrt(3) / 2  # GRPO advantage magnitude of [1, 1, 0, 0]: 0.5 / sqrt(1/3)


def dyn(entropy, initial=2.0):
    return TrainingDynamics(progress=0.5, entropy=entropy, initial_entropy=initial)


def fade(rewards, groups, entropy, mask=None, **params):
    inp = AdvantageInput(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(groups),
        mask,
        dynamics=dyn(entropy),
    )
    return ADVANTAGES.build("fade", **params)(inp)


def test_decomposition_hand_worked_values():
    # A = [2, -1, 0.5, -3], p = [0.25, 0.5, 1.0, 0.0] (group success rates):
    #   A+ = [2, 0, 0.5, 0],  A- = [0, -1, 0, -3]
    #   hard = x (1 - p):  pos_hard = [1.5, 0, 0, 0],    neg_hard = [0, -0.5, 0, -3]
    #   easy = x p:        pos_easy = [0.5, 0, 0.5, 0],  neg_easy = [0, -0.5, 0, 0]
    adv = torch.tensor([2.0, -1.0, 0.5, -3.0], dtype=torch.float64)
    p = torch.tensor([0.25, 0.5, 1.0, 0.0], dtype=torch.float64)
    parts = fade_decompose(adv, p)
    f64 = torch.float64
    assert_close(parts.pos_hard, torch.tensor([1.5, 0.0, 0.0, 0.0], dtype=f64))
    assert_close(parts.pos_easy, torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=f64))
    assert_close(parts.neg_hard, torch.tensor([0.0, -0.5, 0.0, -3.0], dtype=f64))
    assert_close(parts.neg_easy, torch.tensor([0.0, -0.5, 0.0, 0.0], dtype=f64))
    # a fully solved problem (p = 1) is all easy, an unsolved one (p = 0) all hard
    assert parts.pos_hard[2] == 0 and parts.neg_easy[3] == 0
    with pytest.raises(ValueError, match=r"\[B\] adv and success_rate"):
        fade_decompose(adv, p[:3])


def test_phase_from_entropy_dynamics():
    # e = clip((H0 - H) / (margin * H0), 0, 1), H0 = 2, margin 0.5
    assert fade_phase(dyn(2.0), 0.5) == 0.0
    assert fade_phase(dyn(1.5), 0.5) == pytest.approx(0.5)
    assert fade_phase(dyn(0.2), 0.5) == 1.0
    assert fade_phase(dyn(2.6), 0.5) == 0.0  # entropy above its start: exploit


def test_hand_values_exploit_and_explore():
    # group 0: rewards [1, 1, 0, 0], p = 0.5,  A = [+S, +S, -S, -S]
    # group 1: rewards [1, 1, 1, 0], p = 0.75, A = [0.5, 0.5, 0.5, -1.5] (std 0.5)
    r, g = [1, 1, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1]
    # e = 0 (H = H0): medium focus 4p(1-p) = 1, 0.75 -> / mean 0.875 = 8/7, 6/7;
    # negatives x (1 - suppress) = 0.5
    out = fade(r, g, entropy=2.0, suppress=0.5)
    w0, w1 = 8 / 7, 6 / 7
    expected = [w0 * S, w0 * S, -0.5 * w0 * S, -0.5 * w0 * S]
    expected += [w1 * 0.5] * 3 + [-0.5 * w1 * 1.5]
    assert_close(out.advantages, torch.tensor(expected))
    assert out.metrics["fade_phase"] == 0.0 and out.metrics["fade_neg_weight"] == 0.5
    # e = 1 (H dropped by margin 0.3 of H0): hard focus (1-p)^2 = 0.25, 0.0625
    # -> / mean 0.15625 = 1.6, 0.4; negatives at full weight
    out = fade(r, g, entropy=1.4, suppress=0.5)
    expected = [1.6 * S, 1.6 * S, -1.6 * S, -1.6 * S, 0.2, 0.2, 0.2, -0.6]
    assert_close(out.advantages, torch.tensor(expected))
    assert out.metrics["fade_phase"] == pytest.approx(1.0)


def test_difficulty_weights_are_normalised_over_groups_not_responses():
    # e = 0: group 0 = [1, 0] (p = 1/2, 4p(1-p) = 1), group 1 = [1, 0, 0, 0] (p = 1/4, 0.75);
    # mean over the 2 groups = 0.875 -> weights 8/7 and 6/7 (a mean over the 6 responses,
    # 5/6, would give 1.2 and 0.9). Positives are not suppressed, so w = A_fade / A.
    r, g = [1, 0, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1]
    grpo = ADVANTAGES("grpo", AdvantageInput(torch.tensor(r).float(), torch.tensor(g)))
    out = fade(r, g, entropy=2.0).advantages / grpo.advantages
    assert_close(out[[0, 2]], torch.tensor([8 / 7, 6 / 7]))


def sign_ratio(out, grpo):
    """|weight on a negative| / |weight on a positive| inside group 0 ([1, 1, 0, 0])."""
    return (out[2] / grpo[2]) / (out[0] / grpo[0])


@pytest.mark.parametrize("suppress", [0.3, 1.0])
def test_negatives_full_weight_when_exploring_suppressed_when_exploiting(suppress):
    r, g = [1, 1, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]
    grpo = ADVANTAGES("grpo", AdvantageInput(torch.tensor(r).float(), torch.tensor(g))).advantages
    explore = fade(r, g, entropy=1.0, suppress=suppress).advantages  # e = 1
    exploit = fade(r, g, entropy=2.0, suppress=suppress).advantages  # e = 0
    assert sign_ratio(explore, grpo) == pytest.approx(1.0)
    assert sign_ratio(exploit, grpo) == pytest.approx(1.0 - suppress)
    assert ((exploit > 0) == (grpo > 0)).all() or suppress == 1.0  # signs preserved


def test_difficulty_focus_moves_from_medium_to_hard_as_entropy_drops():
    # 7 groups of 8 with 1..7 successes: p = 1/8 .. 7/8
    G = 8
    rewards = [float(i < k) for k in range(1, 8) for i in range(G)]
    groups = [k for k in range(7) for _ in range(G)]
    grpo = ADVANTAGES(
        "grpo", AdvantageInput(torch.tensor(rewards), torch.tensor(groups))
    ).advantages
    phases, hard_vs_medium = [], []
    for H in torch.linspace(2.0, 1.2, 9).tolist():  # margin 0.3: e = 0 .. 1 (and past it)
        out = fade(rewards, groups, entropy=H, margin=0.3)
        w = (out.advantages / grpo)[::G]  # weight of each group (its first, correct, sample)
        phases.append(out.metrics["fade_phase"])
        hard_vs_medium.append((w[0] / w[3]).item())  # p = 1/8 vs p = 1/2
        if phases[-1] == 0.0:
            assert int(w.argmax()) == 3  # medium focus: p = 1/2 weighs most
        if phases[-1] == 1.0:
            assert int(w.argmax()) == 0  # hard focus: the hardest group weighs most
            assert (w[:-1] > w[1:]).all()
    assert phases[0] == 0.0 and phases[-1] == 1.0
    for i in range(len(phases) - 1):  # e rises as H falls, and the focus follows it
        assert phases[i + 1] >= phases[i]
        if phases[i + 1] > phases[i]:
            assert hard_vs_medium[i + 1] > hard_vs_medium[i]
        else:
            assert hard_vs_medium[i + 1] == pytest.approx(hard_vs_medium[i])
    assert hard_vs_medium[-1] > 1.0 > hard_vs_medium[0]


@pytest.mark.parametrize("masked", [False, True])
def test_degenerate_groups_give_zero_without_nan(masked):
    T = 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    m = mask.float() if masked else None
    for H in (2.0, 1.7, 0.5):
        out = fade([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], entropy=H, mask=m)  # all equal
        assert torch.equal(out.advantages, torch.zeros((6, T) if masked else (6,)))
        assert all(math.isfinite(v) for v in out.metrics.values())
        mixed = fade([1, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 1], entropy=H, mask=m)
        assert torch.isfinite(mixed.advantages).all()
        assert (mixed.advantages[:3] == 0).all() and (mixed.advantages[3:] != 0).any()
        if masked:
            assert (mixed.advantages[m == 0] == 0).all()


@pytest.mark.parametrize("entropy", [2.0, 1.4])  # e = 0 (medium focus), e = 1 (hard focus)
def test_continuous_rewards_all_above_or_below_threshold_keep_their_signal(entropy):
    # group 0: binary [1, 1, 0, 0] (p = 1/2); group 1: all above the threshold 0 but distinct
    # (p = 1); group 2: all at or below it, distinct (p = 0). Without the floor both
    # profiles give group 1 weight 0 and the medium one gives group 2 weight 0 (its signal
    # was dropped); with min_weight f = 0.05 every weight is max(profile, f) / mean
    r = [1, 1, 0, 0, 0.9, 0.5, 0.7, 0.6, -0.1, -0.5, -0.2, -0.8]
    g = [0] * 4 + [1] * 4 + [2] * 4
    grpo = ADVANTAGES("grpo", AdvantageInput(torch.tensor(r), torch.tensor(g))).advantages
    out = fade(r, g, entropy=entropy, suppress=0.0).advantages  # no sign suppression
    w = (out / grpo)[::4]
    if entropy == 2.0:  # medium 4p(1-p): [1, 0, 0] -> floored [1, 0.05, 0.05], mean 0.3667
        want = torch.tensor([1.0, 0.05, 0.05]) / (1.1 / 3)
    else:  # hard (1-p)^2: [0.25, 0, 1] -> floored [0.25, 0.05, 1], mean 0.4333
        want = torch.tensor([0.25, 0.05, 1.0]) / (1.3 / 3)
    assert_close(w, want)
    assert (out[4:] != 0).all() and ((out > 0) == (grpo > 0)).all()
    # min_weight = 0 restores the unfloored profiles: group 1 (p = 1) gets nothing
    bare = fade(r, g, entropy=entropy, suppress=0.0, min_weight=0.0).advantages
    assert (bare[4:8] == 0).all()


def test_validation_errors():
    inp = AdvantageInput(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"'fade' needs dynamics \(AdvantageInput\.dynamics\)"):
        ADVANTAGES("fade", inp)
    half = AdvantageInput(inp.rewards, dynamics=TrainingDynamics(entropy=1.0))
    with pytest.raises(ValueError, match=r"fade needs .*initial_entropy"):
        ADVANTAGES("fade", half)
    for kw, msg in (
        ({"gamma": -1.0}, "gamma"),
        ({"suppress": 1.5}, "suppress"),
        ({"margin": 0.0}, "margin"),
        ({"min_weight": -0.1}, "min_weight"),
    ):
        with pytest.raises(RegistryError, match=msg):
            ADVANTAGES.build("fade", **kw)


def test_preset_builds():
    p = get_preset("fade")
    assert p.catalog_id == "004-21" and "no hyper-parameters" in p.notes
    p.build()
