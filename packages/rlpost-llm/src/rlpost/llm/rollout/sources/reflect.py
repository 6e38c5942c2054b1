"""RubricEM's reflection meta-policy on multi-turn episodes (catalog 000-30): "a
shared-backbone reflection meta-policy that distills judged trajectories into reusable
rubric-grounded guidance for future attempts", with Stage-Structured GRPO's stage
judgments in the same run.

A step, for each of its ``P`` tasks (episode seeds) with group size ``G`` and ``m`` of
:class:`rlpost.core.feedback.EpisodeReflection`'s split:

1. ``G - m`` plain episodes, each turn judged by the environment's rubric judge;
2. the task's first failed episode, rendered with the judge's verdict on every turn
   (the environment's ``reflection_prompt``), is reflected on by the policy itself: ``m``
   sampled pieces of guidance (in the search world, a plan for the next attempt);
3. ``m`` guided episodes of the same task, each reading one piece of guidance before the
   question (``"<guidance>:<question>"``); a task with no failure plays ``m`` more plain
   episodes instead;
4. rows: the plain episodes (and the unguided extra ones) in the task's group, the guided
   episodes in a group of their own (their own context), and, with ``meta``, the ``m``
   reflections as a group, each rewarded with the outcome of the episode it guided, so
   GRPO's baseline credits guidance that led to a solved episode over its siblings.

Logged: ``reflect/exact`` (a reflection equals the environment's ``lesson`` of the
judged episode), ``reflect/guided_solved`` and ``reflect/plain_solved_reflected`` (the
guided episodes' success, and the plain round's on the same tasks), ``reflect/rows``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Property
from rlpost.core.feedback import EpisodeReflection
from rlpost.core.peers import OWN, TRAIN
from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.base import encode_observation
from rlpost.llm.data.tasks import Example
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import RolloutBatch
from rlpost.llm.rollout.sources.base import GENERATE, register_source, settings_option
from rlpost.llm.rollout.sources.episodes import EpisodesSource


class _Guided:
    """An environment whose ``reset(key)`` plays ``table[key] = (seed, prefix)``: the
    episode of ``seed`` with ``prefix`` (the guidance) before its first observation."""

    def __init__(self, env: Any, table: list[tuple[int, str]]):
        self.env, self.table = env, table

    def reset(self, key: int) -> str:
        seed, prefix = self.table[key]
        return prefix + self.env.reset(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


@register_source
class EpisodeReflectionSource(EpisodesSource):
    """Plain episodes, reflections on their judged failures, episodes guided by them."""

    name = "episode_reflection"
    layer = GENERATE
    params = EpisodeReflection
    label = "preset {preset.name!r}'s reflection on judged episodes"
    option = "episode_reflection"
    from_option = classmethod(settings_option)
    example = (
        "algo.preset=rubricem_episodes",
        "data.env={name: search, params: {plan: true, reflect: true, slack: 0}, "
        "turn_signal: rubric, max_turns: 5}",
    )
    # (what every data.env run declares, multi-turn episodes, one policy's, is the
    # episodes generator's, whose declarations hold beside this one)
    declares = Declares(
        requires={
            Property.UNSHARDED: "is not wired to sharded weights yet",
            Property.PER_STEP: "reflect on each step's own failures",
        },
        breaks={
            Property.GROUPS_ON_DEMAND: "plays a step's episodes at once",
            Property.EVEN_GROUPS: "make groups uneven (guided episodes, reflections)",
        },
    )

    @classmethod
    def selected(cls, cfg: Any) -> bool:
        return False  # named by a preset, never picked by the data

    @classmethod
    def check(cls, cfg: Any, preset: Any, params: Any) -> None:
        env = cfg.data.env
        need = "an environment that renders judged episodes (search with plan: true, reflect: true)"
        if env is None:
            raise ValueError(f"preset {preset.name!r} reflects on episodes: set data.env to {need}")
        if env.chat:
            raise ValueError(f"preset {preset.name!r}: reflection on chat episodes is not built")
        made = make_env(env.name, **env.params)
        if not callable(getattr(made, "reflection_prompt", None)) or not getattr(
            made, "reflect", True
        ):
            raise ValueError(f"preset {preset.name!r}: data.env {env.name!r} is not {need}")

    @classmethod
    def rows_per_group(cls, params: EpisodeReflection, group_size: int) -> int:
        return group_size + params.split(group_size)[1] * int(params.meta)

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.judge = make_env(self.env.name, **self.env.params)  # renders judged episodes

    def _reflect(self, seeds: list[int], plain, n: int, m: int):
        """The policy's reflections on each task's first failed plain episode: ``(reflected
        task indices, their reflection prompts, the reflections' batch [len * m] or None,
        their texts, the lessons of the judged episodes)``."""
        t = self.trainer
        reflected, asks, lessons = [], [], []
        for g, seed in enumerate(seeds):
            i = next((j for j in range(g * n, (g + 1) * n) if not bool(plain.solved[j])), None)
            if i is None:
                continue
            self.judge.reset(seed)
            reflected.append(g)
            asks.append(self.judge.reflection_prompt(plain.actions[i], plain.infos[i]))
            lessons.append(self.judge.lesson(plain.actions[i], plain.infos[i]))
        if not reflected:
            return reflected, asks, None, [], lessons
        prompts = [encode_observation(t.tok, a) for a in asks]
        batch = t.engine.generate(prompts, m, t.sampling)
        return reflected, asks, batch, batch.texts(t.tok), lessons

    def _guided_round(self, seeds: list[int], reflected: list[int], notes: list[str], m: int):
        """``m`` episodes per task: each reflected task's read a reflection of its own."""
        t, env = self.trainer, self.env
        table = [(s, "") for s in seeds for _ in range(m)]
        for k, g in enumerate(reflected):
            for j in range(m):
                table[g * m + j] = (seeds[g], notes[k * m + j].strip() + ":")
        make = lambda: _Guided(make_env(env.name, **env.params), table)  # noqa: E731
        from rlpost.llm.rollout.agents import env_rollout

        keys = list(range(len(table)))
        return env_rollout(t.engine, t.tok, make, keys, 1, t.sampling, env.max_turns, env.workers)

    def collect(self, want: int | None = None, given=None) -> Collected:
        t, rf = self.trainer, self.params
        t0 = time.perf_counter()
        P, G = t.cfg.rollout.prompts_per_step, t.preset.group_size
        n, m = rf.split(G)
        seeds = [t.cfg.data.seed * 10**6 + self.next_seed + i for i in range(P)]
        self.next_seed += P
        plain = self.rollout(seeds, n, t.sampling)
        reflected, asks, reflections, notes, lessons = self._reflect(seeds, plain, n, m)
        second = self._guided_round(seeds, reflected, notes, m)
        metrics = self._metrics(plain, time.perf_counter() - t0)
        signals = [self._turn_signals(plain, metrics), self._turn_signals(second, {})]
        guided = torch.zeros(P, dtype=torch.bool)
        guided[reflected] = True
        # the plain episodes in their task's group; the extra ones too where unguided,
        # else a group of their own per task (they were played in their guided context)
        group = [g for g in range(P) for _ in range(n)]
        group += [P + g if bool(guided[g]) else g for g in range(P) for _ in range(m)]
        rows = [*plain.batch.prompt_ids, *second.batch.prompt_ids]
        texts = [t.tok.decode(p, skip_special_tokens=True) for p in rows]
        owners = [*seeds_of(seeds, n), *seeds_of(seeds, m)]
        examples = [Example(x, "", {"seed": s}) for x, s in zip(texts, owners, strict=True)]
        parts = [(plain, signals[0]), (second, signals[1])]
        col = _episodes(parts, group, examples, metrics)
        if rf.meta and reflections is not None:  # the meta-policy: a group per failure
            col = _with_reflections(col, reflections, reflected, second.rewards, asks, m)
        solved = second.solved.float().view(P, m)
        exact = [float(notes[k * m + j].strip() == lessons[k])
                 for k in range(len(reflected)) for j in range(m)]  # fmt: skip
        col.metrics |= {
            "reflect/tasks": float(len(reflected)) / P,
            "reflect/exact": sum(exact) / len(exact) if exact else 0.0,
            "reflect/guided_solved": float(solved[guided].mean()) if reflected else 0.0,
            "reflect/plain_solved_reflected": float(plain.solved.float().view(P, n)[guided].mean())
            if reflected
            else 0.0,
            "reflect/rows": float(len(col.rewards) - P * G),
            "time/rollout": time.perf_counter() - t0,
        }
        return col


def reflective_success(trainer: Any, seeds: list[int]) -> dict[str, float]:
    """Greedy success on the episodes of ``seeds``: at the first attempt, and within two
    attempts, the second guided by the policy's own greedy reflection on the judged first
    (for any trainer whose ``data.env`` renders judged episodes, e.g. a GRPO run's);
    ``exact``: the share of reflections equal to the judged episode's lesson (NaN: no
    episode failed)."""
    from rlpost.llm.rollout.agents import env_rollout
    from rlpost.llm.rollout.engines.base import SamplingParams

    t, env = trainer, trainer.cfg.data.env
    greedy = SamplingParams(t.sampling.max_new_tokens, 0.0, stop=t.sampling.stop)
    make = lambda: make_env(env.name, **env.params)  # noqa: E731
    first = env_rollout(t.engine, t.tok, make, seeds, 1, greedy, env.max_turns, env.workers)
    failed = [i for i, ok in enumerate(first.solved.tolist()) if not ok]
    judge, asks, lessons = make(), [], []
    for i in failed:
        judge.reset(seeds[i])
        asks.append(judge.reflection_prompt(first.actions[i], first.infos[i]))
        lessons.append(judge.lesson(first.actions[i], first.infos[i]))
    notes = []
    if failed:
        notes = t.engine.generate([encode_observation(t.tok, a) for a in asks], 1, greedy)
        notes = [x.strip() for x in notes.texts(t.tok)]
    table = [(seeds[i], x + ":") for i, x in zip(failed, notes, strict=True)]
    guided = (lambda: _Guided(make(), table)) if table else None
    second = env_rollout(t.engine, t.tok, guided, list(range(len(table))), 1, greedy,
                         env.max_turns, env.workers) if table else None  # fmt: skip
    n = len(seeds)
    once = float(first.solved.float().sum()) / n
    rescued = float(second.solved.float().sum()) / n if second is not None else 0.0
    hits = sum(x == y for x, y in zip(notes, lessons, strict=True))
    exact = hits / len(notes) if notes else float("nan")  # (nothing failed: no reflection)
    return {"first": once, "two_attempts": once + rescued, "exact": exact}


def seeds_of(seeds: list[int], k: int) -> list[int]:
    """Each seed ``k`` times, in order (the rows of ``k`` episodes per task)."""
    return [s for s in seeds for _ in range(k)]


def _pad(x: Tensor, width: int, value: float) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _episodes(parts: list, group: list[int], examples: list[Example], metrics: dict) -> Collected:
    """The rounds' episodes (``parts``: ``(EnvRollout, (turn signals, stages))``) as one
    step's rows in the groups ``group`` (renumbered densely)."""
    batch = RolloutBatch.concat([ro.batch for ro, _ in parts])
    L = batch.completion_ids.shape[1]
    U = max(ro.turn_rewards.shape[1] for ro, _ in parts)
    stages = [s for _, (_, s) in parts]
    _, dense = torch.unique(torch.tensor(group), return_inverse=True)
    batch.group = dense
    rewards = torch.cat([ro.rewards for ro, _ in parts])
    return Collected(
        batch,
        examples,
        rewards,
        rewards[:, None],
        torch.cat([ro.solved.float() for ro, _ in parts]),
        metrics,
        roles=torch.full((len(rewards),), OWN, dtype=torch.long),
        turn_ids=torch.cat([_pad(ro.turn_ids, L, -1) for ro, _ in parts]),
        turn_rewards=torch.cat([_pad(r, U, 0.0) for _, (r, _) in parts]),
        query_mask=torch.cat([_pad(ro.query_mask, L, 0.0) for ro, _ in parts]),
        turn_stages=None if stages[0] is None else torch.cat([_pad(s, U, -1) for s in stages]),
    )


def _with_reflections(
    col: Collected, reflections: RolloutBatch, reflected: list[int], guided_rewards: Tensor,
    asks: list[str], m: int,
) -> Collected:  # fmt: skip
    """``col`` with the reflections appended, a group per reflected task, each rewarded
    with the reward of the episode it guided (role TRAIN: trained, but not episodes of
    the task, so the rollout statistics skip them); one turn each, of no rubric stage."""
    rows = torch.tensor([g * m + j for g in reflected for j in range(m)])
    R = len(rows)
    batch = RolloutBatch.concat([col.batch, reflections])
    L = batch.completion_ids.shape[1]
    U = col.turn_rewards.shape[1]
    turn = torch.where(_pad(reflections.mask, L, 0.0) > 0, 0, -1)
    rewards = torch.cat([col.rewards, guided_rewards[rows]])
    return Collected(
        batch,
        col.examples + [Example(a, "", {}) for a in asks for _ in range(m)],
        rewards,
        rewards[:, None],
        torch.cat([col.accuracy, (guided_rewards[rows] >= 1.0).float()]),
        col.metrics,
        roles=torch.cat([col.roles, torch.full((R,), TRAIN, dtype=torch.long)]),
        turn_ids=torch.cat([_pad(col.turn_ids, L, -1), turn]),
        turn_rewards=torch.cat([col.turn_rewards, torch.zeros(R, U)]),
        query_mask=torch.cat([_pad(col.query_mask, L, 0.0), torch.zeros(R, L)]),
        turn_stages=None
        if col.turn_stages is None
        else torch.cat([col.turn_stages, torch.full((R, U), -1, dtype=torch.long)]),
    )


__all__ = ["EpisodeReflectionSource", "reflective_success"]
