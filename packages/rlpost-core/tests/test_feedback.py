"""FBOS-RL's row-level decision (000-15): who is re-rolled with feedback, what EPA copies
under the bare prompt and what ECC trains in the guided context."""

from __future__ import annotations

import re

import pytest
import torch

from rlpost.core.feedback import FeedbackExploration, fbos_layout, rescued
from rlpost.core.presets import get_preset


def test_the_split_keeps_the_group_budget_and_at_least_one_plain_rollout():
    fb = FeedbackExploration(share=0.5)
    assert [fb.split(g) for g in (2, 3, 8)] == [(1, 1), (1, 2), (4, 4)]
    assert FeedbackExploration(share=0.9).split(4) == (1, 3)
    assert FeedbackExploration(share=0.01).split(8) == (7, 1)
    with pytest.raises(ValueError, match="group_size >= 2"):
        fb.split(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"share": 0.0}, "share"),
        ({"share": 1.0}, "share"),
        ({"epa": False, "ecc": False}, "epa or ecc"),
        ({"template": "{prompt}"}, "template"),
        ({"reflector": "oracle"}, "verifier or policy"),
        ({"meta": True}, "needs reflector: policy"),
        ({"reflector": "policy", "reflect_template": "{prompt}:"}, "contain {response}"),
        ({"bank": 4}, "bank (verified guidance kept) needs reflector: policy"),
        ({"reflector": "policy", "bank": 4}, "put {guidance}"),
        ({"reflector": "policy", "bank": -1}, "bank must be >= 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        FeedbackExploration(**kwargs)


def test_epa_copies_only_verified_guided_solutions_and_ecc_only_guided_rollouts():
    guided = torch.tensor([True, False, True])
    correct = torch.tensor([[True, False], [True, True], [False, False]])
    lay = fbos_layout(FeedbackExploration(), guided, correct)
    assert lay.plain.tolist() == [False, False, True, True, False, False]
    assert lay.ecc.tolist() == [True, True, False, False, True, True]
    # prompt 1's successes were sampled from the bare prompt: ordinary rows, not EPA's
    assert lay.epa.tolist() == [True, False, False, False, False, False]
    only_epa = fbos_layout(FeedbackExploration(ecc=False), guided, correct)
    assert not only_epa.ecc.any() and only_epa.epa.tolist() == lay.epa.tolist()
    only_ecc = fbos_layout(FeedbackExploration(epa=False), guided, correct)
    assert not only_ecc.epa.any() and only_ecc.ecc.tolist() == lay.ecc.tolist()
    with pytest.raises(ValueError, match=r"\[P, m\]"):
        fbos_layout(FeedbackExploration(), guided, correct.flatten())


def test_rescued_counts_prompts_with_no_plain_success_and_an_epa_solution():
    guided = torch.tensor([True, True, True])
    second = torch.tensor([[True], [True], [False]])
    lay = fbos_layout(FeedbackExploration(), guided, second)
    first = torch.tensor([[False, False], [True, False], [False, False]])
    assert rescued(first, lay, 1).tolist() == [True, False, False]


def feedback_of(name: str) -> FeedbackExploration:
    """The preset's guided round: its ``feedback`` rollout source's settings (the group
    size is validated against them where a trainer loads the preset: the LLM's
    test_feedback.py)."""
    (choice,) = [c for c in get_preset(name).rollout if c.name == "feedback"]
    return FeedbackExploration(**choice.params)


def test_the_presets_declare_the_guided_round():
    fb = feedback_of("fbos")
    assert fb.epa and fb.ecc
    assert not feedback_of("fbos_epa").ecc and not feedback_of("fbos_ecc").epa


def test_rubricem_reflect_has_the_policy_write_the_guidance_and_trains_it():
    fb = feedback_of("rubricem_reflect")
    assert fb is not None and fb.reflector == "policy" and fb.meta
    ask = fb.reflect("12+34=", "57")
    assert ask == "12+34=57:"  # the judged failure, in the reflector's format
    # the reflection "+10" guides the attempt in FBOS-RL's format, the attempt first
    assert fb.prompt("12+34=", "57", "+10") == "57+10>12+34="


def test_the_bank_offers_its_guidance_in_either_template():
    fb = FeedbackExploration(
        reflector="policy", bank=4, template="{guidance}:{response}{feedback}>{prompt}",
        reflect_template="{guidance}{prompt}{response}:",
    )  # fmt: skip
    assert fb.prompt("12+34=", "57", "+10", "+10 -1") == "+10 -1:57+10>12+34="
    assert fb.reflect("12+34=", "57", "+10") == "+1012+34=57:"
    assert fb.prompt("12+34=", "57", "+10") == ":57+10>12+34="  # (an empty bank)
