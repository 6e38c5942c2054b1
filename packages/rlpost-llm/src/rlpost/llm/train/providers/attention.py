"""Per-token loss weights from attention entropy (``Input.TOKEN_WEIGHTS``, catalog
001-08): the attention maps of an extra no-grad forward with eager attention, turned
into weights by the ``algo.token_weights`` entry (``rlpost.core.weights``), on the whole
step's batch (then sliced per micro-batch, so micro-batching stays exact)."""

from __future__ import annotations

from typing import Any

from rlpost.core.contract import Declares, Input, Property
from rlpost.core.weights import TOKEN_WEIGHTINGS, TokenWeightInput
from rlpost.llm.train import probes
from rlpost.llm.train.providers.base import INPUT_PROVIDERS, InputProvider


@INPUT_PROVIDERS.register
class AttentionWeightsProvider(InputProvider):
    name = "token_weights"
    label = "algo.token_weights"
    order = 80
    example = ("algo.token_weights.name=anchors",)
    provides = frozenset({Input.TOKEN_WEIGHTS})
    declares = Declares(
        requires={
            Property.UNSHARDED: "reads attention maps of the whole policy",
            Property.WHOLE_BATCH: "weighs tokens over the whole step batch",
        }
    )

    @classmethod
    def wanted(cls, cfg: Any, recipe: Any, reads: frozenset[Input]) -> bool:
        return cfg.algo.token_weights is not None

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        tw = trainer.cfg.algo.token_weights
        self.weighting = TOKEN_WEIGHTINGS.build(tw.name, **dict(tw.params))

    def advantaged(self, step: Any, out: Any) -> None:
        t = self.trainer
        att = probes.attention_token_entropy(t.model, step.batch, t.cfg.optim.micro_batch_size)
        tw = self.weighting(TokenWeightInput(att, step.mask, step.get(Input.DYNAMICS)))
        step[Input.TOKEN_WEIGHTS] = tw.weights
        step.metrics.update(tw.metrics)
