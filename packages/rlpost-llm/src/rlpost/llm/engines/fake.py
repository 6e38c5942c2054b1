"""A scripted engine behind the rollout protocol, for tests and dry runs without a model."""

from __future__ import annotations

from rlpost.llm.engines.base import RolloutBatch, SamplingParams


class FakeEngine:
    """Protocol-conforming engine that replays scripted completions.

    ``script(prompt_ids, n) -> list of (token ids, engine logprobs, finish reason)``.
    """

    def __init__(self, script, pad_id: int = 0):
        self.script = script
        self.pad_id = pad_id
        self.policy_version = 0
        self.calls = 0

    def generate(self, prompts, n, sampling: SamplingParams) -> RolloutBatch:
        self.calls += 1
        rows = [(p, *r) for p in prompts for r in self.script(p, n)]
        return RolloutBatch.from_rows(rows, len(prompts), n, self.pad_id, self.policy_version)

    def update_weights(self, state_dict, version):
        self.policy_version = version

    def sleep(self):
        pass

    def wake(self):
        pass
