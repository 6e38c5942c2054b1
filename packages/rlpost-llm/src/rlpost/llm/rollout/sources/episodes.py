"""Multi-turn episodes of a text environment (``data.env``): each training prompt is an
episode's seed, each group ``group_size`` episodes of one seed, the reward the
environment's (token-in / token-out rollouts: :mod:`rlpost.llm.rollout.agents`).
Training seeds count up from ``data.seed * 10**6``; held-out ones start at ``10**9`` and
are never trained on."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from torch import Tensor

from rlpost.core.contract import Declares, Input, Property
from rlpost.llm.data.envs import make_env
from rlpost.llm.data.envs.base import ENVIRONMENTS, encode_observation
from rlpost.llm.data.tasks import Example
from rlpost.llm.model.policy import completion_logprobs, eval_mode, make_seq_batch
from rlpost.llm.rollout.collected import Collected
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.sources.base import GENERATE, RolloutSource, register_source


@register_source
class EpisodesSource(RolloutSource):
    """``rollout.prompts_per_step`` seeds a step, a group of episodes each."""

    name = "episodes"
    layer = GENERATE
    label = "data.env (multi-turn episodes)"
    state_key = "env_next"
    example = ("data.env={name: household}",)
    declares = Declares(
        requires={Property.UNSHARDED: "is not wired to sharded weights yet"},
        breaks={
            Property.SINGLE_TURN: "plays multi-turn episodes",
            Property.GROUPS_ON_DEMAND: "plays a step's episodes at once",
        },
    )

    @classmethod
    def selected(cls, cfg: Any) -> bool:
        return cfg.data.env is not None

    def __init__(self, trainer: Any, inner: Any, params: Any):
        super().__init__(trainer, inner, params)
        self.env = trainer.cfg.data.env
        self.next_seed = 0  # the next training episode seed
        self.tools = None
        if self.env.chat:
            self._check_chat_template()

    def _check_chat_template(self) -> None:
        """Chat episodes need a chat template; warn once if it is not append-only."""
        from rlpost.llm.rollout.chat import append_only_violations

        tok = self.trainer.tok
        if not getattr(tok, "chat_template", None):
            raise ValueError(
                "data.env.chat: the tokenizer has no chat template (use a chat model, or "
                "set data.env.chat=false for plain-text episodes)"
            )
        self.tools = getattr(make_env(self.env.name, **self.env.params), "tools", None)
        bad = append_only_violations(tok, self.tools)
        if bad:
            warnings.warn(
                f"data.env.chat: the chat template is not append-only ({bad[0]}); turns "
                "after such a re-rendering are aligned at the first difference",
                stacklevel=2,
            )

    def rollout(self, seeds: list[int], n: int, sampling: SamplingParams):
        from rlpost.llm.rollout.agents import env_rollout

        t, env = self.trainer, self.env
        chat = None
        if env.chat:
            from rlpost.llm.rollout.chat import ChatFormat

            chat = lambda: ChatFormat(t.tok, env.system, self.tools)  # noqa: E731
        return env_rollout(
            t.engine, t.tok, lambda: make_env(env.name, **env.params), seeds, n,
            sampling, env.max_turns, env.workers, chat,
        )  # fmt: skip

    def collect(self, want: int | None = None, given=None) -> Collected:
        from rlpost.llm.rollout.agents import group_hindsight

        t = self.trainer
        t0 = time.perf_counter()
        P, G = t.cfg.rollout.prompts_per_step, t.preset.group_size
        seeds = [t.cfg.data.seed * 10**6 + self.next_seed + i for i in range(P)]
        self.next_seed += P
        ro = self.rollout(seeds, G, t.sampling)
        b = ro.batch
        hints = group_hindsight(ro, G)
        examples = [
            Example(
                t.tok.decode(b.prompt_ids[i], skip_special_tokens=True),
                "",
                {"seed": seeds[i // G], "hindsight": hints[i]},
            )
            for i in range(len(b))
        ]
        metrics = self._metrics(ro, time.perf_counter() - t0)
        turn_rewards, stages = self._turn_signals(ro, metrics)
        acc = (ro.rewards >= 1.0).float()
        return Collected(
            b, examples, ro.rewards, ro.rewards[:, None], acc, metrics,
            turn_ids=ro.turn_ids, turn_rewards=turn_rewards, query_mask=ro.query_mask,
            turn_stages=stages,
        )  # fmt: skip

    def _metrics(self, ro, seconds: float) -> dict[str, float]:
        """Turns, success, the environment's own ``log/<name>`` values, exploit rates."""
        steps = [x for ep in ro.infos for x in ep]
        n = len(ro.batch)
        metrics = {
            "env/turns": float(ro.turns.float().mean()),
            "env/solved": float(ro.solved.float().mean()),
            "time/rollout": seconds,
        }
        if steps and "valid" in steps[0]:
            metrics["env/valid_frac"] = sum(bool(x.get("valid")) for x in steps) / len(steps)
        if steps and "composed" in steps[0]:
            metrics["env/composed_per_episode"] = sum(x.get("composed", 0) for x in steps) / n
        logged: dict[str, list[float]] = {}
        for x in steps:
            for k, v in x.items():
                if k.startswith("log/"):
                    logged.setdefault(k[4:], []).append(float(v))
        metrics.update({f"env/{k}": sum(v) / len(v) for k, v in logged.items()})
        if self.env.params.get("shortcuts"):  # planted shortcuts (001-21)
            last = [ep[-1] for ep in ro.infos if ep]
            metrics["env/exploit_rate"] = sum(bool(x.get("exploit")) for x in last) / n
        return metrics

    def _turn_signals(self, ro, metrics: dict[str, float]):
        """Each turn's signal (``data.env.turn_signal``) and, for a rubric, its stage."""
        t = self.trainer
        turn_rewards, stages = ro.turn_rewards, None
        if self.env.turn_signal == "ig" and Input.TURNS in t.reads:
            turn_rewards = information_gain(
                t.model, t.tok, ro, t.sampling.temperature, t.cfg.optim.micro_batch_size
            )
            metrics["env/ig_abs_mean"] = float(turn_rewards.abs().mean())
        if self.env.turn_signal == "rubric":
            judge = ENVIRONMENTS[self.env.name].judge  # a static method
            stages = torch.full_like(turn_rewards, -1, dtype=torch.long)
            turn_rewards = torch.zeros_like(turn_rewards)
            for i, ep in enumerate(ro.infos):
                for u, info in enumerate(ep):
                    stages[i, u], turn_rewards[i, u] = judge(info)
            if self.env.judge is not None:  # rubrics in words, read by a judge model
                self._judge_in_words(ro, stages, turn_rewards)
            for s in range(int(stages.max()) + 1):
                on = stages == s
                if bool(on.any()):
                    metrics[f"env/rubric_stage{s}"] = float(turn_rewards[on].mean())
        return turn_rewards, stages

    def _judge_in_words(self, ro, stages: Tensor, scores: Tensor) -> None:
        """Overwrite ``scores`` ``[N, U]`` where a turn's stage has criteria in words
        (``data.env.judge``) with the judge model's rubric score of the turn (its action
        and the observation it got back, the episode's question as the task)."""
        from rlpost.llm.rollout.judge import TEMPLATE, WordJudge, turn_texts

        cfg = self.env.judge
        if getattr(self, "word_judge", None) is None:
            self.word_judge = WordJudge(cfg.path, (), cfg.template or TEMPLATE, *cfg.answers)
        names = ENVIRONMENTS[self.env.name].STAGES
        tok = self.trainer.tok
        texts = turn_texts(ro, tok)
        at, tasks, responses, rubrics = [], [], [], []
        for i, turns in enumerate(texts):
            question = tok.decode(ro.batch.prompt_ids[i], skip_special_tokens=True)
            for u, text in enumerate(turns):
                rubric = cfg.criteria.get(names[int(stages[i, u])]) if stages[i, u] >= 0 else None
                if rubric:
                    at.append((i, u))
                    tasks.append(question)
                    responses.append(text)
                    rubrics.append(rubric)
        for (i, u), v in zip(at, self.word_judge.scores(tasks, responses, rubrics), strict=True):
            scores[i, u] = v

    def evaluate(self, examples: list | None = None) -> float:
        """The greedy success rate on ``data.eval_size`` held-out seeds."""
        if examples is not None:
            raise ValueError("a data.env run is evaluated on held-out episode seeds, not examples")
        t = self.trainer
        greedy = SamplingParams(t.sampling.max_new_tokens, 0.0, stop=t.sampling.stop)
        seeds = [10**9 + i for i in range(t.cfg.data.eval_size)]
        return float(self.rollout(seeds, 1, greedy).solved.float().mean())

    def state_dict(self) -> tuple[Any, dict]:
        return self.next_seed, {}

    def load_state_dict(self, state: Any, tensors: dict) -> None:
        self.next_seed = int(state)


@torch.no_grad()
def information_gain(
    model, tokenizer, ro, temperature: float = 1.0, micro_batch: int = 64
) -> Tensor:
    """``[N, U]`` A²TGPO's information gain over an :class:`rlpost.llm.rollout.agents.EnvRollout`
    ``ro``: for each turn ``u`` that is followed by an
    observation, ``P(truth | context after u) - P(truth | context before u)``, the
    probability of the episode's ``ground_truth()`` action (its ids and EOS) under
    ``model`` with the whole sequence up to the turn's end (its observation included) as
    context; the last turn of an episode gets 0 (nothing follows it to predict)."""
    b = ro.batch
    N, U = ro.turn_rewards.shape
    if any(t is None for t in ro.truths):
        raise ValueError("information gain needs an environment with ground_truth()")
    if any(x.get("task", 0) > 0 for ep in ro.infos for x in ep):
        raise ValueError(
            "information gain needs one answer per episode, and a chained episode "
            "(tasks > 1) poses several: use data.env.turn_signal env or rubric"
        )
    contexts, owner = [], []  # (episode, turn boundary k): context after k turns
    lens = b.lengths.tolist()
    for i in range(N):
        tid = ro.turn_ids[i, : lens[i]].tolist()
        cut = [0]  # the boundaries: the start of each turn after the first
        cut += [j for j in range(1, len(tid)) if tid[j] >= 0 and tid[j] != tid[j - 1]]
        for k, c in enumerate(cut):
            contexts.append(list(b.prompt_ids[i]) + b.completion_ids[i, :c].tolist())
            owner.append((i, k))
    ans = [[*encode_observation(tokenizer, ro.truths[i]), tokenizer.eos_token_id] for i, _ in owner]
    width = max(len(a) for a in ans)
    pad = b.pad_id
    ids = torch.full((len(ans), width), pad, dtype=torch.long)
    mask = torch.zeros(len(ans), width)
    for r, a in enumerate(ans):
        ids[r, : len(a)] = torch.tensor(a)
        mask[r, : len(a)] = 1.0
    prob = torch.zeros(len(ans))
    with eval_mode(model):
        for s in range(0, len(ans), micro_batch):
            sl = slice(s, s + micro_batch)
            sb = make_seq_batch(contexts[sl], ids[sl], mask[sl], pad)
            lp = completion_logprobs(model, sb, temperature)[0].float().cpu()
            prob[sl] = (lp * mask[sl]).sum(1).exp()
    ig = torch.zeros(N, U)
    at = {key: float(p) for key, p in zip(owner, prob.tolist(), strict=True)}
    for (i, k), p in at.items():
        if k > 0:  # turn k-1 took the probability from at[(i, k-1)] to p
            ig[i, k - 1] = p - at[(i, k - 1)]
    return ig
