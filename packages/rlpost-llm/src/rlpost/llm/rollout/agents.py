"""Multi-turn agents: token-in / token-out rollouts in text environments (issue 20).

The bug class every multi-turn trainer meets is train / inference drift across turns:
re-tokenising the earlier turns' text gives other ids than the ones sampled, so the
policy is trained on tokens it never produced. Here nothing is ever re-tokenised:

* an episode's sequence is the first observation's ids (the prompt), then for each turn
  the action's ids *exactly as sampled* (with the engine's log-probs of them) and the
  next observation's ids, appended;
* each turn generates from that whole sequence (prompt + every earlier action and
  observation, as ids), so the context of every sampled token is the one it is trained in;
* observation tokens have loss mask 0 and turn id -1; action tokens mask 1 and their turn
  index (``Input.TURNS``); every forward of the trainer still attends to the observations
  (``RolloutBatch.context``), so the training context of each action is its sampling one.

Episodes run batched: every turn, all live episodes generate together (one engine call),
then their environments step, concurrently in ``workers`` threads (slow tools, e.g. a
retriever or a sandboxed program, overlap). A group is ``n`` episodes of the same seed
(the same task).
The episode's reward is the sum of its step rewards. ``turn_rewards[b, u]`` is each turn's
own signal: the environment's ``info["gain"]`` where it reports one (progress made by the
turn, the household world's; A²TGPO's per-turn signal), else the step's reward.
:func:`rlpost.llm.rollout.sources.episodes.information_gain` gives the abstract's own signal where the environment knows the
right final action (``ground_truth()``): the change, across each turn, in the policy's
probability of that action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from rlpost.llm.data.envs.base import TextEnv, encode_observation, hint_text
from rlpost.llm.rollout.chat import ChatFormat, parse_tool_call
from rlpost.llm.rollout.engines.base import RolloutBatch, RolloutEngine, SamplingParams


@dataclass
class EnvRollout:
    """Episodes as a :class:`RolloutBatch` (completion = actions and observations) with
    ``turn_ids`` ``[N, L]``, ``rewards`` ``[N]``, ``turn_rewards`` ``[N, U]`` (each turn's
    signal, see the module docstring), ``turns``
    ``[N]`` (turns taken), ``solved`` ``[N]`` (the last step's ``info["solved"]``), each
    step's ``info`` per episode, each episode's actions as text (as the environment
    read them), its environment's ``ground_truth()`` (``None`` where it has none) and
    ``query_mask`` ``[N, L]``: 1 on the action tokens of the turns whose ``info`` says
    ``query`` (a search, SD-Search's query positions)."""

    batch: RolloutBatch
    turn_ids: Tensor
    rewards: Tensor
    turn_rewards: Tensor
    turns: Tensor
    solved: Tensor
    infos: list[list[dict]]
    actions: list[list[str]]
    truths: list[str | None]
    query_mask: Tensor


def as_action(env, text: str) -> tuple[str, bool]:
    """``(the environment's action, whether it was a tool call)`` for the policy's ``text``:
    a ``<tool_call>`` (:func:`rlpost.llm.rollout.chat.parse_tool_call`) becomes
    ``env.tool_action(name, arguments)`` where the environment has tools; else the text."""
    if not hasattr(env, "tool_action"):
        return text, False
    call = parse_tool_call(text)
    if call is None:
        return text, False
    return env.tool_action(*call), True


def env_rollout(
    engine: RolloutEngine,
    tokenizer,
    make: Callable[[], TextEnv],
    seeds: list[int],
    n: int,
    sampling: SamplingParams,
    max_turns: int,
    workers: int = 1,
    chat: Callable[[], ChatFormat] | None = None,
) -> EnvRollout:
    """``n`` episodes per seed, at most ``max_turns`` turns each, the environments stepped
    in ``workers`` threads (see the module docstring). ``chat``: a factory of
    :class:`~rlpost.llm.rollout.chat.ChatFormat` (one per episode), for a chat model's own format;
    an action that is a tool call reaches an environment with ``tool_action`` as its own
    action."""
    from concurrent.futures import ThreadPoolExecutor

    episodes = _Episodes(tokenizer, make, seeds, n, max_turns, chat)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="env") if workers > 1 else None
    for u in range(max_turns):
        live = episodes.live()
        if not live:
            break
        episodes.play_turn(u, live, engine, sampling, pool)
    if pool is not None:
        pool.shutdown()
    return episodes.assemble(engine, len(seeds), n)


def _step_all(steppers: list[Callable], actions: list[str], pool) -> list:
    """Each environment's step on its action (``steppers[r](actions[r])``), concurrently in
    ``pool``'s threads where there is one, in order otherwise; the results in order."""
    if pool is not None:
        return list(pool.map(lambda f, t: f(t), steppers, actions))
    return [f(t) for f, t in zip(steppers, actions, strict=True)]


class _Episodes:
    """The episodes of one :func:`env_rollout` as they run: their environments, chat
    formats (``None``: plain text), prompts and ground truths, and what each has so far:
    its completion's ids, log-probs and token turns (``-1``: observation), each turn's
    reward and signal, each step's ``info``, its actions as text, and whether it ended."""

    def __init__(
        self,
        tokenizer,
        make: Callable[[], TextEnv],
        seeds: list[int],
        n: int,
        max_turns: int,
        chat: Callable[[], ChatFormat] | None,
    ):
        """Start ``n`` episodes per seed: each environment made and reset to its seed, its
        first observation the prompt (in the episode's own chat format, given ``chat``)."""
        N = len(seeds) * n
        self.tokenizer, self.max_turns = tokenizer, max_turns
        self.envs = [make() for _ in range(N)]
        first = [self.envs[i].reset(seeds[i // n]) for i in range(N)]
        self.formats = [chat() for _ in range(N)] if chat is not None else None
        if self.formats is not None:
            self.prompts = [self.formats[i].prompt_ids(o) for i, o in enumerate(first)]
        else:
            self.prompts = [encode_observation(tokenizer, o) for o in first]
        self.truths = [e.ground_truth() if hasattr(e, "ground_truth") else None for e in self.envs]
        self.ids: list[list[int]] = [[] for _ in range(N)]
        self.lps: list[list[float]] = [[] for _ in range(N)]
        self.turn: list[list[int]] = [[] for _ in range(N)]  # each token's turn, -1: observation
        self.step_rewards = torch.zeros(N, max_turns)
        self.signal = torch.zeros(N, max_turns)
        self.infos: list[list[dict]] = [[] for _ in range(N)]
        self.said: list[list[str]] = [[] for _ in range(N)]
        self.done = [False] * N
        self.version = 0

    def live(self) -> list[int]:
        """The episodes that have not ended."""
        return [i for i in range(len(self.done)) if not self.done[i]]

    def play_turn(self, u: int, live: list[int], engine: RolloutEngine, sampling, pool) -> None:
        """Turn ``u`` of the ``live`` episodes: their actions generated together (one engine
        call, from each whole sequence so far), their environments stepped
        (:func:`_step_all`), each action and the observation it got appended."""
        out = engine.generate([self.prompts[i] + self.ids[i] for i in live], 1, sampling)
        self.version = out.policy_version
        lens = out.lengths.tolist()
        actions = [out.completion_ids[r, : lens[r]].tolist() for r in range(len(live))]
        texts = [self.tokenizer.decode(a, skip_special_tokens=True) for a in actions]
        calls = [as_action(self.envs[i], t) for i, t in zip(live, texts, strict=True)]
        texts = [c[0] for c in calls]
        results = _step_all([self.envs[i].step for i in live], texts, pool)
        for r, i in enumerate(live):
            res = results[r]
            self._append_action(i, u, actions[r], out.logprobs[r, : lens[r]].tolist(), res)
            self.said[i].append(texts[r])
            if res.done:
                self.done[i] = True
                continue
            self._append_observation(i, actions[r], res.observation, calls[r][1])

    def _append_action(self, i: int, u: int, a_ids: list[int], a_lps: list[float], res) -> None:
        """Episode ``i``'s action of turn ``u`` (ids as sampled, with their log-probs) and
        its step's result: the turn's reward, signal (``info["gain"]``, else the reward)
        and ``info``."""
        self.ids[i] += a_ids
        self.lps[i] += a_lps
        self.turn[i] += [u] * len(a_ids)
        self.step_rewards[i, u] = res.reward
        self.signal[i, u] = float(res.info.get("gain", res.reward))
        self.infos[i].append(res.info)

    def _append_observation(self, i: int, a_ids: list[int], observation: str, tool: bool) -> None:
        """Episode ``i``'s next observation after its action ``a_ids`` (a ``tool`` call or
        not), in its chat format or as plain text: context only (log-prob 0, turn -1)."""
        if self.formats is not None:
            o_ids = self.formats[i].observation_ids(a_ids, observation, tool)
        else:
            o_ids = encode_observation(self.tokenizer, observation)
        self.ids[i] += o_ids
        self.lps[i] += [0.0] * len(o_ids)
        self.turn[i] += [-1] * len(o_ids)

    def assemble(self, engine: RolloutEngine, n_seeds: int, n: int) -> EnvRollout:
        """The episodes as an :class:`EnvRollout` (``n`` per seed, ``n_seeds`` seeds): the
        action tokens trained on, the observations attended to only."""
        N, max_turns, turn, infos = len(self.envs), self.max_turns, self.turn, self.infos
        rows = [
            (self.prompts[i], self.ids[i], self.lps[i], "stop" if self.done[i] else "length")
            for i in range(N)
        ]
        pad = engine_pad(engine, self.tokenizer)
        batch = RolloutBatch.from_rows(rows, n_seeds, n, pad, self.version)
        L = batch.completion_ids.shape[1]
        t = torch.full((N, L), -1, dtype=torch.long)
        for i in range(N):
            t[i, : len(turn[i])] = torch.tensor(turn[i], dtype=torch.long)
        m = (t >= 0).float()  # actions are trained on, observations and padding are not
        searched = torch.tensor(
            [[bool(x.get("query")) for x in ep] + [False] * (max_turns - len(ep)) for ep in infos]
        ).reshape(N, max_turns)
        q = searched.gather(1, t.clamp_min(0)).float() * m  # the action tokens of search turns
        # observations: attended (context), never trained on (mask)
        batch = replace(batch, mask=m, logprobs=batch.logprobs * m, context=batch.mask)
        turns = torch.tensor([len(x) for x in infos], dtype=torch.long)
        solved = torch.tensor([bool(x and x[-1].get("solved", False)) for x in infos])
        rewards = self.step_rewards.sum(1)
        return EnvRollout(
            batch, t, rewards, self.signal, turns, solved, infos, self.said, self.truths, q
        )


def group_hindsight(ro: EnvRollout, n: int) -> list[str]:
    """Each episode's hindsight hint (:func:`rlpost.llm.data.envs.base.hint_text`): the
    actions of the shortest solved episode of its group (``n`` episodes per seed), ``""``
    where the group solved nothing (a teacher context for StepOPSD)."""
    out = []
    for g in range(len(ro.actions) // n):
        rows = range(g * n, (g + 1) * n)
        won = [i for i in rows if bool(ro.solved[i])]
        best = min(won, key=lambda i: (len(ro.actions[i]), i)) if won else None
        out += [hint_text(ro.actions[best]) if best is not None else ""] * n
    return out


def engine_pad(engine: RolloutEngine, tokenizer) -> int:
    pad = getattr(engine, "pad_id", None)
    if pad is not None:
        return int(pad)
    return int(
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )


__all__ = [
    "EnvRollout",
    "encode_observation",
    "env_rollout",
    "group_hindsight",
]
