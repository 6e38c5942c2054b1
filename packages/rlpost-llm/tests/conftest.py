"""Shared fixtures: a tiny untrained policy and a fake rollout engine."""

from __future__ import annotations

import pytest

from rlpost.llm.config import load_config

FAST = [
    "model.path=tiny-random",
    "rollout.group_size=4",
    "rollout.prompts_per_step=4",
    "rollout.max_new_tokens=4",
    "train.steps=2",
    "run.eval_every=0",
    "run.save_every=0",
    "reward.workers=0",
    "run.progress=false",
    "run.tensorboard=false",
    "run.threads=1",
    "data.eval_size=8",
    "algo.kl_coef=0.0",
    "run.device=cpu",  # the same on a GPU machine; test_cuda.py asks for the GPU
]


@pytest.fixture
def fast_cfg(tmp_path):
    def make(*overrides: str):
        return load_config(None, [*FAST, f"run.dir={tmp_path / 'run'}", *overrides])

    return make


@pytest.fixture
def fast_overrides():
    return list(FAST)


@pytest.fixture
def applied_grads():
    """``grads(trainer, fn) -> (gradients, fn())``: the gradients the trainer's update guard
    is handed to apply while ``fn`` runs (the last update's, by parameter name)."""

    def grads(tr, fn):
        seen, step = {}, tr.guard.step

        def recording(apply):
            for name, q in tr.model.named_parameters():
                if q.grad is not None:
                    seen[name] = q.grad.detach().clone()
            return step(apply)

        tr.guard.step = recording
        try:
            out = fn()
        finally:
            tr.guard.step = step
        return seen, out

    return grads
