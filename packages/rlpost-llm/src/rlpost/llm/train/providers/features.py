"""Prompt and completion features (``Input.PROMPT_FEATURES`` / ``COMPLETION_FEATURES``):
the policy's mean-pooled last hidden states over each row's prompt or completion, from a
no-grad forward (BASIS's cross-prompt values, GCPO's semantic disagreement)."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Declares, Input, Property
from rlpost.llm.train.probes import pooled_hidden
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class FeaturesProvider(InputProvider):
    name = "features"
    label = "prompt / completion features"
    order = 55
    example = ("algo.advantage.name=basis",)
    provides = frozenset({Input.PROMPT_FEATURES, Input.COMPLETION_FEATURES})
    declares = Declares(requires={Property.UNSHARDED: "run no-grad forwards of the whole policy"})

    def provide(self, step: Any) -> None:
        t = self.trainer
        mbs = t.cfg.optim.micro_batch_size
        for need, part in (
            (Input.PROMPT_FEATURES, "prompt"),
            (Input.COMPLETION_FEATURES, "completion"),
        ):
            if need in t.reads:
                step[need] = pooled_hidden(t.model, step.batch, part, mbs)
