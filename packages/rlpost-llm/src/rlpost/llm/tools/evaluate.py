"""Held-out evaluation of a policy (optionally a saved checkpoint's weights)."""

from __future__ import annotations

from pathlib import Path

import torch

from rlpost.llm.config import Config
from rlpost.llm.data.prompts import encode_prompt, make_prompt_source
from rlpost.llm.model.policy import load_policy
from rlpost.llm.rollout.engines import make_local_engine
from rlpost.llm.rollout.engines.base import SamplingParams
from rlpost.llm.rollout.rewards import RewardPool, math_verify_reward


def _policy_engine(cfg: Config, checkpoint=None):
    """The tokenizer and an in-process engine on the policy of ``cfg.model`` (a
    checkpoint's weights over it when given), on ``run.device``."""
    from rlpost.core import pick_device

    model, tok = load_policy(cfg, progress=cfg.run.progress, device=pick_device(cfg.run.device))
    if checkpoint is not None:
        from safetensors.torch import load_model

        load_model(model, str(Path(checkpoint) / "model.safetensors"), strict=True)
    engine = make_local_engine(
        cfg.rollout.engine if cfg.rollout.engine != "vllm" else "auto", model, tok
    )
    return tok, engine


def _heldout(cfg: Config):
    """The held-out prompt source and its verifier (the task's, else math-verify)."""
    source = make_prompt_source(
        cfg.data.task, dict(cfg.data.task_params), cfg.data.path, cfg.data.eval_size, cfg.data.seed
    )
    return source, (source.task.score if cfg.data.path is None else math_verify_reward)


def evaluate_config(
    cfg: Config, checkpoint: str | None = None, samples: int = 0
) -> dict[str, float | int]:
    """Greedy accuracy on the held-out set; with ``samples=k`` also mean sampled accuracy
    and pass@k (any of k samples at the rollout temperature is correct)."""
    tok, engine = _policy_engine(cfg, checkpoint)
    source, fn = _heldout(cfg)
    exs = source.eval_examples
    prompts = [encode_prompt(tok, e.prompt) for e in exs]
    r = cfg.rollout
    out: dict[str, float | int] = {"examples": len(exs)}
    with RewardPool(
        {"correct": fn}, workers=cfg.reward.workers, timeout_s=cfg.reward.timeout_s
    ) as pool:

        def score(n: int, sp: SamplingParams) -> torch.Tensor:
            b = engine.generate(prompts, n, sp)
            return (
                (pool.score(b.texts(tok), [exs[g] for g in b.group.tolist()]).rewards >= 1.0)
                .float()
                .view(len(exs), n)
            )

        out["greedy_accuracy"] = float(
            score(1, SamplingParams(r.max_new_tokens, 0.0, stop=tuple(r.stop))).mean()
        )
        if samples > 0:
            torch.manual_seed(cfg.run.seed)
            hits = score(
                samples,
                SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k, tuple(r.stop)),
            )
            out["sampled_accuracy"] = float(hits.mean())
            out[f"pass@{samples}"] = float(hits.amax(1).mean())
    return out


def monitor_config(
    cfg: Config,
    contexts: dict[str, str],
    samples: int = 8,
    checkpoint=None,
    noise: list[float] | None = None,
    noise_seeds: int = 3,
):
    """``rlpost-llm monitor``: the exploration-hacking report
    (:func:`rlpost.llm.tools.hacking.exploration_hacking_report`) of the policy of ``cfg.model``
    (or a checkpoint's weights) on the held-out prompts, ``samples`` per problem at the
    rollout temperature, the verifier out of process. With ``noise`` (sigmas), also the
    weight-noising probe (:func:`rlpost.llm.tools.hacking.weight_noise_probe`, ``noise_seeds``
    draws per sigma) in every context."""
    from rlpost.llm.tools.hacking import exploration_hacking_report, weight_noise_probe

    tok, engine = _policy_engine(cfg, checkpoint)
    source, fn = _heldout(cfg)
    r = cfg.rollout
    sp = SamplingParams(r.max_new_tokens, r.temperature, r.top_p, r.top_k, tuple(r.stop))
    torch.manual_seed(cfg.run.seed)
    with RewardPool(
        {"correct": fn}, workers=cfg.reward.workers, timeout_s=cfg.reward.timeout_s
    ) as pool:

        def score(texts, exs):
            return pool.score(texts, exs).rewards.tolist()

        report = exploration_hacking_report(
            engine, tok, source.eval_examples, score, contexts, samples, sp
        )
        if noise:
            report.noise = weight_noise_probe(
                engine.model, engine, tok, source.eval_examples, score, contexts, noise,
                noise_seeds, samples, sp, sample_seed=cfg.run.seed,
            )  # fmt: skip
        return report


def exploits_config(cfg: Config, checkpoint=None, greedy: bool = False):
    """``rlpost-llm exploits``: the exploit-rate report
    (:func:`rlpost.llm.tools.hacking.shortcut_report`) of the policy of ``cfg.model`` (or a
    checkpoint's weights) in ``cfg.data.env`` with its planted shortcuts and hardened, one
    episode per held-out seed (``data.eval_size``), sampled at the rollout temperature
    (``greedy``: at 0)."""
    from rlpost.llm.tools.hacking import shortcut_report

    env = cfg.data.env
    if env is None:
        raise ValueError("exploits: set data.env (an environment with params.shortcuts)")
    tok, engine = _policy_engine(cfg, checkpoint)
    r = cfg.rollout
    sp = SamplingParams(r.max_new_tokens, 0.0 if greedy else r.temperature, r.top_p, r.top_k)
    torch.manual_seed(cfg.run.seed)
    seeds = [10**9 + i for i in range(cfg.data.eval_size)]  # the trainer's held-out seeds
    return shortcut_report(engine, tok, env.name, dict(env.params), seeds, sp, env.max_turns)


def export_checkpoint(cfg: Config, checkpoint: str | Path, out: str | Path) -> Path:
    """``rlpost-llm export``: the policy of ``cfg.model`` with a checkpoint's weights, LoRA
    adapters merged, written to ``out`` as a standalone Hugging Face model folder (loads
    with ``AutoModelForCausalLM.from_pretrained(out)``, no rlpost needed)."""
    from rlpost.core.io.checkpoint import load_weights
    from rlpost.llm.model.policy import export_merged

    model, tok = load_policy(cfg, progress=cfg.run.progress)
    load_weights(Path(checkpoint), model)
    return export_merged(model, tok, Path(out))
