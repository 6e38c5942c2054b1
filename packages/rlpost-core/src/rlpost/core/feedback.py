"""Feedback-guided exploration (FBOS-RL, catalog 000-15).

GRPO samples every rollout of a group from the same prompt, so on a prompt beyond the
policy's reach the whole group fails and the step has no gradient there. FBOS-RL spends
part of each group's rollout budget differently: ``G - m`` rollouts of the prompt as
usual, then, where one of them failed and the environment said why, ``m`` re-rollouts
conditioned on that failed attempt and its feedback (the *guided* context). A prompt with
no diagnosed failure spends its ``m`` on the plain prompt, so every group costs exactly
``G`` rollouts, as GRPO's does. Two objectives are trained on the result:

EPA (exploitation-oriented policy alignment)
    every guided re-rollout the verifier accepts is placed, token for token, under the
    *original* prompt and joins that prompt's group: the policy on the bare prompt is
    aligned toward the solution feedback found. A prompt whose plain rollouts all failed,
    which gives GRPO nothing, now has a positive example and a baseline to compare it to.
    These rows are off-context (sampled with the feedback in view): their importance
    ratio is taken against the current policy on the bare prompt.
ECC (exploration-oriented capability cultivation)
    the guided re-rollouts, in their guided context, form a group of their own with its
    own baseline: the policy learns to turn feedback into a correction, which makes the
    next step's guided exploration find more solutions for EPA (the flywheel).

:func:`fbos_layout` is the row-level decision; the trainer generates, verifies and
assembles (``rlpost.llm.rollout.feedback``).

**The policy as reflector** (RubricEM's reflection meta-policy, catalog 000-30,
``reflector: policy``): the diagnosis in the guided context is not the environment's but
the policy's own. The shared backbone reads a judged failure (``reflect_template`` over
``{prompt}`` and ``{response}``; only attempts the judge failed are reflected on) and
writes guidance; each of the ``m`` guided rollouts is conditioned on a reflection of its
own. With ``meta: true`` the reflections are trained too, a group per judged failure
with GRPO's baseline: a reflection's reward is the judge's verdict on the attempt it
guided, so guidance that leads to verified solutions is reinforced (the meta-policy).

**The guidance bank** (``bank: N``, with the policy reflector): the reflections whose
guided attempt the judge accepted are kept across steps, at most ``N`` distinct ones
ranked by how often they led to a verified attempt, and the ``show`` best are offered as
``{guidance}`` to later attempts at other problems (in ``template`` or in
``reflect_template``): judged trajectories distilled into reusable guidance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor


@dataclass(frozen=True)
class FeedbackExploration:
    """FBOS-RL's settings (see the module docstring).

    ``share``: the fraction of each group's rollouts spent on guided re-rollouts
    (``m = round(share * G)``, at least 1, and at least one plain rollout left);
    ``epa`` / ``ecc``: train the two objectives (both: FBOS-RL; one: its ablation);
    ``template``: the guided prompt, over ``{prompt}``, ``{response}`` (the failed
    attempt) and ``{feedback}`` (the diagnosis of it); ``reflector``: who diagnoses,
    ``verifier`` (the environment, FBOS-RL) or ``policy`` (the policy, from
    ``reflect_template`` over ``{prompt}`` and ``{response}``); ``meta``: train the
    policy's reflections on the verdicts of the attempts they guided (RubricEM's
    reflection meta-policy; needs ``reflector: policy``)."""

    share: float = 0.5
    epa: bool = True
    ecc: bool = True
    template: str = "{feedback}>{prompt}"
    reflector: str = "verifier"
    reflect_template: str = "{prompt}{response}:"
    meta: bool = False
    bank: int = 0
    show: int = 3

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"feedback share must be in (0, 1), got {self.share}")
        if not (self.epa or self.ecc):
            raise ValueError("feedback exploration needs epa or ecc (or both) switched on")
        if "{prompt}" not in self.template or "{feedback}" not in self.template:
            raise ValueError(
                f"feedback template must contain {{prompt}} and {{feedback}}, got {self.template!r}"
            )
        if self.reflector not in ("verifier", "policy"):
            raise ValueError(
                f"feedback reflector must be verifier or policy, got {self.reflector!r}"
            )
        if self.meta and self.reflector != "policy":
            raise ValueError("feedback meta (training the reflections) needs reflector: policy")
        if self.bank < 0 or self.show < 1:
            raise ValueError(
                f"feedback bank must be >= 0 and show >= 1, got {self.bank}, {self.show}"
            )
        if self.bank and self.reflector != "policy":
            raise ValueError("feedback bank (verified guidance kept) needs reflector: policy")
        if self.bank and "{guidance}" not in self.template + self.reflect_template:
            raise ValueError(
                "feedback bank: put {guidance} (the bank's best entries) in template or "
                "reflect_template"
            )
        if self.reflector == "policy" and "{response}" not in self.reflect_template:
            raise ValueError(
                "feedback reflect_template must contain {response} (the failed attempt the "
                f"policy reflects on), got {self.reflect_template!r}"
            )

    def split(self, group_size: int) -> tuple[int, int]:
        """``(plain, guided)`` rollouts per group: they sum to ``group_size``."""
        return split_group(self.share, group_size, "feedback exploration")

    def prompt(self, prompt: str, response: str, feedback: str, guidance: str = "") -> str:
        return self.template.format(
            prompt=prompt, response=response, feedback=feedback, guidance=guidance
        )

    def reflect(self, prompt: str, response: str, guidance: str = "") -> str:
        """The policy reflector's prompt: a failed ``response`` to ``prompt`` (and the
        bank's ``guidance``, where the template shows it)."""
        return self.reflect_template.format(prompt=prompt, response=response, guidance=guidance)


def split_group(share: float, group_size: int, what: str) -> tuple[int, int]:
    """``(plain, guided)`` rollouts of a group of ``group_size``: ``m = round(share * G)``,
    at least 1, with at least one plain rollout left; they sum to ``group_size``."""
    if group_size < 2:
        raise ValueError(f"{what} needs group_size >= 2, got {group_size}")
    m = min(max(1, round(share * group_size)), group_size - 1)
    return group_size - m, m


@dataclass(frozen=True)
class EpisodeReflection:
    """RubricEM's reflection meta-policy on multi-turn episodes (catalog 000-30): after a
    plain round of ``G - m`` episodes per task, the policy reflects on the task's first
    failed episode as the environment's rubric judge scored it, writing ``m`` pieces of
    guidance, and ``m`` guided episodes of the same task each read one of them; tasks
    with no failure spend their ``m`` on plain episodes. ``share``: ``m = round(share *
    G)`` (as :class:`FeedbackExploration`'s); ``meta``: train the reflections, a group
    per judged failure, each rewarded with the outcome of the episode it guided."""

    share: float = 0.5
    meta: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"episode reflection share must be in (0, 1), got {self.share}")

    def split(self, group_size: int) -> tuple[int, int]:
        """``(plain, guided)`` episodes per group: they sum to ``group_size``."""
        return split_group(self.share, group_size, "episode reflection")


class FBOSLayout(NamedTuple):
    """Per second-round row (``[P * m]``, prompt-major): ``plain`` rows were sampled
    from the original prompt (a prompt without a diagnosed failure) and join its group
    as ordinary rollouts; ``ecc`` rows are trained in their guided context, in a group of
    their own; ``epa`` rows are copied under the original prompt into its group."""

    plain: Tensor
    ecc: Tensor
    epa: Tensor


def fbos_layout(fb: FeedbackExploration, guided: Tensor, correct: Tensor) -> FBOSLayout:
    """``guided`` ``[P]`` bool: whether prompt i's second round was guided;
    ``correct`` ``[P, m]`` bool: the verifier's verdict on each second-round rollout."""
    if correct.dim() != 2 or correct.shape[0] != guided.shape[0]:
        raise ValueError(
            f"correct must be [P, m] with P = len(guided) = {guided.shape[0]}, "
            f"got {tuple(correct.shape)}"
        )
    g = guided.bool()[:, None].expand_as(correct)
    plain = ~g
    ecc = g & fb.ecc
    epa = g & correct.bool() & fb.epa
    return FBOSLayout(plain.flatten(), ecc.flatten(), epa.flatten())


def rescued(first_correct: Tensor, layout: FBOSLayout, m: int) -> Tensor:
    """``[P]`` bool: the prompts whose plain rollouts all failed and that EPA gives a
    verified solution (groups GRPO could not learn from)."""
    return ~first_correct.bool().any(1) & layout.epa.view(-1, m).any(1)


__all__ = [
    "EpisodeReflection",
    "FBOSLayout",
    "FeedbackExploration",
    "fbos_layout",
    "rescued",
    "split_group",
]
