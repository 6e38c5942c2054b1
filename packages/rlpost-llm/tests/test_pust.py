"""PUST (004-04): a proxy's relative improvement transferred exactly to a primary of the
same architecture, with a strength; a mismatched primary refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlpost.core.update_transfer import relative_update, transfer
from rlpost.llm.config import load_config
from rlpost.llm.model.policy import load_policy
from rlpost.llm.tools.pust import pust
from rlpost.llm.tools.weights import checkpoint_steps
from rlpost.llm.trainer import Trainer


def test_the_update_is_the_optimised_minus_the_initial_and_moves_the_primary():
    init = {"w": torch.tensor([1.0, 2.0]), "step": torch.tensor(3)}
    opt = {"w": torch.tensor([1.5, 1.0]), "step": torch.tensor(4)}
    d = relative_update(init, opt)
    assert set(d) == {"w"} and d["w"].tolist() == [0.5, -1.0]  # integers are no update
    out = transfer({"w": torch.tensor([0.0, 0.0]), "b": torch.ones(1)}, d, alpha=2.0)
    assert out["w"].tolist() == [1.0, -2.0] and out["b"].tolist() == [1.0]


def _odd_length(completion: str, example) -> float:
    return float(len(completion) % 2)


def test_a_proxy_runs_improvement_lands_exactly_on_a_primary(fast_cfg, tmp_path):
    from transformers import AutoModelForCausalLM

    runs = []
    for i in range(2):  # the proxy, and a primary of the same architecture (another run)
        cfg = fast_cfg("optim.lr=1e-2", "run.save_every=2", f"run.seed={i}",
                       f"run.dir={tmp_path / f'r{i}'}")  # fmt: skip
        Trainer(cfg, reward_fn=_odd_length).train()
        runs.append(Path(cfg.run.dir))
    rep = pust(runs[0], runs[1], tmp_path / "out", alpha=0.5)
    assert rep["tensors"] > 0 and rep["update_norm"] > 0
    base0, _ = load_policy(load_config(str(runs[0] / "config.yaml"), []), progress=False)
    proxy = load_file(str(checkpoint_steps(runs[0])[-1][1] / "model.safetensors"))
    primary = load_file(str(checkpoint_steps(runs[1])[-1][1] / "model.safetensors"))
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for k, w in primary.items():
        want = w + 0.5 * (proxy[k] - base0.state_dict()[k])
        assert torch.allclose(got[k], want, atol=1e-6), k
    assert json.loads((tmp_path / "out" / "pust.json").read_text())["alpha"] == 0.5


def test_a_primary_of_another_width_is_refused_naming_the_tensor(fast_cfg, tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = fast_cfg("run.save_every=2")
    Trainer(cfg).train()
    base, tok = load_policy(load_config(str(Path(cfg.run.dir) / "config.yaml"), []), progress=False)
    c = base.config.to_dict()
    c.update(hidden_size=64, intermediate_size=128, head_dim=16)
    narrow = Qwen2ForCausalLM(Qwen2Config(**c))
    narrow.save_pretrained(tmp_path / "narrow")
    tok.save_pretrained(tmp_path / "narrow")
    with pytest.raises(ValueError, match=r"pust: the proxy .* tensor '[\w.]+' is \("):
        pust(cfg.run.dir, tmp_path / "narrow", tmp_path / "x")
