"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.fixture
def interpreted():
    """``run(script) -> dict``: a ``_*_triton_check.py`` script beside the tests, run in a
    subprocess under Triton's interpreter (which must be chosen before triton is imported);
    the JSON it prints."""

    def run(name: str) -> dict:
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        script = Path(__file__).with_name(name)
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    return run


@pytest.fixture
def routed_unchanged():
    """``check(route) -> int``: a tiny Qwen2 and its copy routed by ``route(model) -> the
    modules routed`` give the same loss and every gradient, bit for bit; the count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def check(route) -> int:
        cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
        torch.manual_seed(0)
        plain, routed = Qwen2ForCausalLM(cfg), Qwen2ForCausalLM(cfg)
        routed.load_state_dict(plain.state_dict())
        count = route(routed)
        ids = torch.randint(0, 50, (2, 9))
        outs = []
        for model in (plain, routed):
            loss = model(ids, labels=ids).loss
            loss.backward()
            outs.append((loss.detach(), [p.grad for p in model.parameters()]))
        assert torch.equal(outs[0][0], outs[1][0])
        assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1], strict=True))
        return count

    return check
