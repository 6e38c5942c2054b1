"""A tiny base per environment, built and cached by our own code: the character Qwen2 of
:mod:`rlpost.llm.model.tiny`, supervised on the environment's scripted demonstrations
(``env.demonstrate()``), every action token trained, every observation token context
only, in exactly the transcript layout of :func:`rlpost.llm.rollout.agents.env_rollout`.

``model.path: tiny`` with ``data.env`` set loads it (built on first use). Parameters that
only cap an episode (``budget``, ``slack``) do not change the demonstrations and are left out of the
cache key, so one base serves every budget.

An environment with a ``hints`` attribute (a share, e.g. the household world's 0.5) has
that share of its SFT episodes start with a hindsight hint, the episode's own solution
(:func:`hint_text`): the base then also reads a hint when one is given, as an instruction
model reads its context, which is what a hindsight self-teacher (StepOPSD) relies on. An
environment with ``sft_row(tok, seed, rng)`` may supply rows of its own (``None``: an
ordinary demonstration), e.g. the search world's reflection examples.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rlpost.core.io.cache import default_cache_dir
from rlpost.llm.data.envs.base import encode_observation, hint_text, make_env

ENV_BASE_VERSION = 1
# parameters that do not change the demonstrations (episode limits, planted shortcuts)
_EPISODE_ONLY = ("budget", "slack", "shortcuts", "hardened")


def demonstration(
    tok, env, seed: int, hint: bool = False, prefix: str = ""
) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one demonstrated episode: labels on actions and their EOS,
    ``-100`` on observations. ``hint``: the episode's prompt starts with its own solution
    (:func:`hint_text`), so the base learns to follow a hindsight hint when it has one;
    ``prefix``: it starts with that text instead (guidance the demonstration follows)."""
    first = env.reset(seed)
    actions = env.demonstrate()
    ids = encode_observation(tok, (hint_text(actions) if hint else prefix) + first)
    labels = [-100] * len(ids)
    for action in actions:
        a = [*encode_observation(tok, action), tok.eos_token_id]
        ids += a
        labels += a
        res = env.step(action)
        if res.done:
            break
        o = encode_observation(tok, res.observation)
        ids += o
        labels += [-100] * len(o)
    return ids, labels


def _batch(rows: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def env_base_path(name: str, params: dict[str, Any], steps: int, seed: int, cache_dir=None) -> Path:
    from rlpost.llm.data.envs.base import ENVIRONMENTS

    cls = ENVIRONMENTS.get(name)
    defaults = {
        k: p.default for k, p in (inspect.signature(cls).parameters.items() if cls else ())
    }  # a parameter set to its default builds the same base as one left out
    keyed = {
        k: v
        for k, v in params.items()
        if k not in _EPISODE_ONLY and not (k in defaults and defaults[k] == v)
    }
    hints = getattr(cls, "hints", 0.0)
    key = json.dumps(
        {"env": name, "params": keyed, "steps": steps, "seed": seed, "v": ENV_BASE_VERSION}
        | ({"hints": hints} if hints else {}),
        sort_keys=True,
    )
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "llm" / f"tiny-env-{name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def build_env_base(
    name: str,
    params: dict[str, Any] | None = None,
    *,
    steps: int = 800,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    cache_dir=None,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Build (or find in the cache) the tiny base of environment ``name``: ``steps`` SFT
    steps on demonstrations of training seeds; its greedy success on 128 held-out seeds
    (with the demonstrations' own turn budget) goes to ``base_info.json``."""
    from rlpost.llm.model import tiny

    params = dict(params or {})
    target = env_base_path(name, params, steps, seed, cache_dir)
    if (target / "base_info.json").is_file() and not force:
        return target
    demo_params = {k: v for k, v in params.items() if k not in _EPISODE_ONLY}
    env = make_env(name, **demo_params)
    hints = float(getattr(env, "hints", 0.0))
    t0 = time.perf_counter()
    tok, model = _new_model(env, seed)
    _sft_on_demonstrations(model, tok, env, steps, batch_size, lr, seed, hints, name, progress)
    budget = getattr(env, "budget", None) or 8  # the search world's own limit applies anyway
    success = _heldout_success(model, tok, lambda: make_env(name, **demo_params), budget)
    info = {
        "env": name, "params": demo_params, "steps": steps, "seed": seed,
        "heldout_success": success, "hints": hints,
        "seconds": round(time.perf_counter() - t0, 1), "version": ENV_BASE_VERSION,
    }  # fmt: skip
    tiny.publish_base(target, model, tok, info, force)
    if progress:
        print(
            f"built {target}: held-out success {info['heldout_success']:.3f} with the "
            f"demonstrations' budget ({info['seconds']:.0f} s)",
            file=sys.stderr,
        )
    return target


def _new_model(env, seed: int):
    """``(tokenizer, model)``: the character tokenizer and a Qwen2 initialised under
    ``seed``, their context ``env``'s ``positions`` (the tiny default's without one)."""
    from transformers import Qwen2ForCausalLM

    from rlpost.llm.model import tiny

    tok = tiny.build_tokenizer()
    positions = getattr(env, "positions", tiny.MAX_POSITIONS)
    config = tiny.tiny_config(tok, positions=positions)
    model = tiny.init_model(Qwen2ForCausalLM, config, tok, seed)
    tok.model_max_length = positions
    return tok, model


def _sft_on_demonstrations(
    model,
    tok,
    env,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    hints: float,
    name: str,
    progress: bool,
) -> None:
    """``steps`` SFT steps of ``model`` (left in eval mode) on batches of ``batch_size``
    demonstrations (:func:`demonstration`) of random training seeds of ``env``, a ``hints``
    share of them hinted, with the tiny base's optimizer, schedule and step."""
    from tqdm.auto import tqdm

    from rlpost.llm.model import tiny

    opt, sched = tiny.sft_optimizer(model, lr, steps)
    rng = random.Random(f"env-sft-{seed}")
    model.train()
    bar = tqdm(range(steps), desc=f"sft {name}", disable=not progress, file=sys.stderr)
    extra = getattr(env, "sft_row", None)  # an environment's own rows (reflection)
    for _ in bar:
        rows = []
        for _ in range(batch_size):
            seed = rng.randrange(10**9)
            row = extra(tok, seed, rng) if extra is not None else None
            rows.append(row or demonstration(tok, env, seed, rng.random() < hints))
        loss = tiny.sft_step(model, opt, sched, _batch(rows, tok.pad_token_id))
        bar.set_postfix(loss=f"{loss.item():.4f}")
    model.eval()


def _heldout_success(model, tok, make, budget: int) -> float:
    """The greedy success rate of ``model`` on the trainer's 128 held-out seeds of the
    environments ``make`` makes, at most ``budget`` turns an episode."""
    from rlpost.llm.rollout.agents import env_rollout
    from rlpost.llm.rollout.engines import make_local_engine
    from rlpost.llm.rollout.engines.base import SamplingParams

    engine = make_local_engine("hf", model, tok)
    held = [10**9 + i for i in range(128)]  # the trainer's held-out seeds
    ro = env_rollout(engine, tok, make, held, 1, SamplingParams(8, 0.0), budget)
    return float(ro.solved.float().mean())


__all__ = ["build_env_base", "demonstration", "env_base_path"]
