"""The run's reward functions, scoring rollouts in worker processes.

``reward.funcs`` (or TRL-style ``reward_funcs`` given from Python) become a
:class:`~rlpost.core.pool.RewardPool` with time and memory limits; the scalar reward is
their weighted sum, each component is kept (vector estimators, ``reward/<name>/mean``),
and the verifier's verdict (the ``correct`` component, else the first, at 1) is the
accuracy. An environment scores its own episodes, in process: then there is no pool.
A function that fails on every completion, ``reward.stop_after_failing`` rounds in a row,
stops the run (:class:`~rlpost.core.guard.FailingRewards`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rlpost.core.guard import FailingRewards
from rlpost.core.io.config import import_object
from rlpost.llm.data.tasks import Example, format_reward
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.rewards import RewardPool, as_verifier, check_reward_signature


def named(funcs) -> dict:
    """``{name: fn}`` of a list of reward callables (their ``__name__``, made unique) or a
    dict as it is."""
    if isinstance(funcs, dict):
        return dict(funcs)
    out: dict = {}
    for fn in funcs:
        base = getattr(fn, "__name__", type(fn).__name__)
        name, i = base, 1
        while name in out:
            i += 1
            name = f"{base}_{i}"
        out[name] = fn
    if not out:
        raise ValueError("reward_funcs: at least one reward function")
    return out


def import_reward(spec: str):
    """``"package.module:function"`` -> the function (a picklable module-level callable)."""
    return import_object(spec, "reward.funcs")


class Scorer:
    """Scores a step's rollouts (see the module docstring).

    ``prompts``: the run's prompt source (its ``verifier()`` is the ``correct`` reward);
    ``reward_fn``: a "correct" verifier replacing it; ``reward_funcs``: reward callables
    replacing ``cfg.reward.funcs``; ``pool``: start the worker processes (rank 0 only).
    """

    def __init__(
        self, cfg: Any, prompts: Any, tok: Any, reward_fn=None, reward_funcs=None, pool=True
    ):
        self.tok = tok
        given = None
        if reward_funcs is not None:  # TRL's reward_funcs: callables given from Python
            given = named(reward_funcs)
            if cfg.reward.weights is not None and len(cfg.reward.weights) != len(given):
                raise ValueError(
                    f"reward.weights: {len(cfg.reward.weights)} weights for "
                    f"{len(given)} reward_funcs"
                )
            ws = cfg.reward.weights or [1.0] * len(given)
            self.weights = dict(zip(given, ws, strict=True))
        elif cfg.data.env is not None:  # the environment's reward is the only one
            self.weights = {"env": 1.0}
        else:
            self.weights = cfg.reward.weight_of()
        self.names = list(self.weights)
        self.pool = None
        fns = None  # an environment scores its episodes itself, in process
        if given is not None:
            for name, fn in given.items():
                check_reward_signature(fn, f"reward_funcs: {name}")
            fns = {name: as_verifier(fn) for name, fn in given.items()}
        elif cfg.data.env is None:
            fns = {n: self._function(n, prompts, reward_fn) for n in self.names}
        if pool and fns is not None:
            r = cfg.reward
            self.pool = RewardPool(
                fns, workers=r.workers, timeout_s=r.timeout_s, memory_mb=r.memory_mb,
                weights=self.weights,
            )  # fmt: skip
        self.failing = FailingRewards(
            self.names, cfg.reward.stop_after_failing, "reward.stop_after_failing"
        )
        self.noise = None  # the verifier noise of reward.noise (000-07)
        if cfg.reward.noise is not None:
            from rlpost.llm.rollout.noise import VerifierNoise

            k = self.verdict_column()
            self.noise = VerifierNoise(cfg.reward.noise, k, self.weights[self.names[k]])

    @staticmethod
    def needs_answer(cfg: Any, reward_fn=None, reward_funcs=None) -> bool:
        """Whether the prompts must carry answers: the configured "correct" reward checks
        them (unless a verifier or reward functions are given from Python)."""
        correct = "correct" in [f.name for f in cfg.reward.funcs]
        return reward_fn is None and reward_funcs is None and correct

    @staticmethod
    def _function(name: str, prompts: Any, override=None):
        if name == "correct":
            if override is not None:
                check_reward_signature(override, "reward_fn")
            return override if override is not None else prompts.verifier()
        if name == "format":
            return format_reward
        return as_verifier(import_reward(name))

    def score(self, batch: RolloutBatch, examples: list[Example], train: bool = True):
        """Every row of ``batch`` (row ``i`` answers ``examples[batch.group[i]]``);
        ``train``: rewards to train on (``reward.noise`` applies), else to measure."""
        rows = [examples[g] for g in batch.group.tolist()]
        result = self.pool.score(batch.texts(self.tok), rows)
        if result.failed is not None:  # a function failing on everything stops the run
            self.failing.record(result.failed, self.pool.last_failures)
        if train and self.noise is not None:
            result = self.noise.apply(result)
        return result

    def verdict_column(self) -> int:
        """The verifier's component: "correct", else the first function's."""
        return self.names.index("correct") if "correct" in self.names else 0

    def accuracy(self, components: Tensor) -> Tensor:
        """The verifier's verdict: the "correct" component (else the first) at 1."""
        return (components[:, self.verdict_column()] >= 1.0).float()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
