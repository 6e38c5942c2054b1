"""A scripted engine behind the rollout protocol, for tests and dry runs without a model."""

from __future__ import annotations

from rlpost.llm.rollout.engines.base import RolloutBatch, SamplingParams


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


class ActionScriptEngine:
    """An engine that plays fixed action strings turn by turn (for testing environments
    and the multi-turn rollout): ``actions[k][u]`` is what the ``k``-th live episode says
    at turn ``u`` (each ended by EOS), with made-up log-probs ``-0.1, -0.2, ...``. Every
    context it is asked to continue is kept in ``calls``. Episodes that end early leave the
    live list, so script episodes that run equally long, or order them by length."""

    def __init__(self, tok, actions: list[list[str]]):
        self.tok, self.actions, self.calls = tok, actions, []
        self.turn = 0
        self.pad_id = tok.pad_token_id

    def generate(self, prompts, n, sampling: SamplingParams) -> RolloutBatch:
        self.calls.append([list(p) for p in prompts])
        rows = []
        for k, p in enumerate(prompts):
            ids = self.tok.encode(self.actions[k][self.turn], add_special_tokens=False)
            ids = [*ids, self.tok.eos_token_id]
            rows.append((p, ids, [-0.1 * (j + 1) for j in range(len(ids))], "stop"))
        self.turn += 1
        return RolloutBatch.from_rows(rows, len(prompts), 1, self.pad_id, 3)
