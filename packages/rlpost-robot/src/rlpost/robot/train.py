"""Training entry point of the robot domain: ``rlpost-robot train --config <recipe>``.

:func:`train_from_config` builds (or loads from the cache) the demonstrations and the BC
policy of the config's policy kind, evaluates it, runs the configured algorithm
(:data:`rlpost.robot.algos.ALGORITHMS`) and evaluates again; the trainer holds no
algorithm or policy-kind names. ``rlpost-robot demo`` is OTQL's recipe through it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def train_from_config(cfg: Any) -> dict[str, Any]:
    """Build / load the demonstrations and the BC policy, evaluate, fine-tune, evaluate.

    Writes ``cfg.run.dir``: ``config.yaml``, ``metrics.jsonl`` (one row per OTQL round),
    ``success.png``, ``rollout.png`` (when a renderer works), ``policy/``, ``demo.json``.
    """
    import torch
    import yaml

    from rlpost.core.io.metrics import MetricsLogger
    from rlpost.robot.algos import ALGORITHMS
    from rlpost.robot.algos.common import evaluate_policy
    from rlpost.robot.pretrain import POLICY_KINDS, build_demo_dataset, load_bc_policy, load_demos

    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    out = Path(cfg.run.dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    t0 = time.perf_counter()
    policy = load_bc_policy(build_policy_for(cfg))
    demos = load_demos(build_demo_dataset(cfg.task, **_demo_kw(cfg)))
    t_build = time.perf_counter() - t0
    # integration steps matter only for kinds that integrate (a flow); ACT decodes in one pass
    steps = tuple(cfg.run.eval_steps) if POLICY_KINDS[cfg.policy.kind].multi_step else (1,)

    def evaluate() -> dict[str, dict[str, float]]:
        return {
            str(n): evaluate_policy(policy, cfg.task, cfg.run.eval_episodes, n, seed=10_000)
            for n in steps
        }

    before = evaluate()
    t1 = time.perf_counter()
    logger = MetricsLogger(out, tensorboard=False)
    try:
        algo = ALGORITHMS.get(cfg.algo.name)
        history = algo.run(
            policy,
            cfg.task,
            demos,
            cfg.algorithm_config(),
            log=lambda row: logger.log(row["episodes"], row),
            progress=cfg.run.progress,
        )["history"]
    finally:
        logger.close()
    t_train = time.perf_counter() - t1
    policy.eval()
    after = evaluate()
    policy.save(out / "policy")
    result = {
        "task": cfg.task,
        "algo": cfg.algo.name,
        "algo_title": algo.title,
        "policy": cfg.policy.kind,
        "episodes": getattr(cfg.algorithm_config(), algo.episodes_field),
        "eval_episodes": cfg.run.eval_episodes,
        "steps": list(steps),
        "demo_success": sum(d.success for d in demos) / len(demos),
        "before": {k: v["success"] for k, v in before.items()},
        "after": {k: v["success"] for k, v in after.items()},
        "before_metrics": before,
        "after_metrics": after,
        "history": history,
        "seconds_build": round(t_build, 1),
        "seconds_train": round(t_train, 1),
    }
    from rlpost.robot.demo import _frame_strip, _plot

    _plot(result, out / "success.png")
    result["rollout_note"] = _frame_strip(cfg.task, policy, out / "rollout.png", seed=10_000)
    (out / "demo.json").write_text(json.dumps(result, indent=1))
    return result


def _demo_kw(cfg: Any) -> dict[str, int]:
    return {"n_good": cfg.demos.n_good, "n_poor": cfg.demos.n_poor}


def build_policy_for(cfg: Any) -> Path:
    """The cached BC policy folder of a run config (its task, demonstrations and policy
    kind, :data:`rlpost.robot.pretrain.POLICY_KINDS`); built on first use."""
    from rlpost.robot.pretrain import POLICY_KINDS

    kind = POLICY_KINDS[cfg.policy.kind]
    return kind.build(cfg.task, _demo_kw(cfg), cfg.policy, cfg.run.progress)
