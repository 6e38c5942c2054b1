"""Checkpoints load with the field's own loaders: transformers for a full model, PEFT for
LoRA adapters; `rlpost-llm export` writes a merged standalone model."""

from pathlib import Path

import torch

from rlpost.apps.llm.cli import main as cli
from rlpost.llm.model.policy import load_policy
from rlpost.llm.trainer import Trainer

from .test_trainer import parity_reward


def _logits(model, tok):
    ids = torch.tensor([tok("12+34=", add_special_tokens=False).input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_full_checkpoint_loads_with_from_pretrained(fast_cfg):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = fast_cfg("train.steps=2", "run.save_every=2")
    t = Trainer(cfg, reward_fn=parity_reward)
    t.train()
    ckpt = Path(cfg.run.dir) / "checkpoints" / "step-000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok("12+34=").input_ids == t.tok("12+34=").input_ids
    t.model.eval()
    assert torch.equal(_logits(model, tok), _logits(t.model, tok))


def test_a_lora_checkpoint_is_a_peft_adapter_and_exports_merged(fast_cfg, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    overrides = ["model.lora.r=4", "train.steps=2", "run.save_every=2", "optim.lr=1e-2"]
    cfg = fast_cfg(*overrides)
    t = Trainer(cfg, reward_fn=parity_reward)
    t.train()
    ckpt = Path(cfg.run.dir) / "checkpoints" / "step-000002"
    assert (ckpt / "adapter_config.json").is_file()
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:  # the adapters, not the base
        keys = list(f.keys())
    assert keys and all("lora_" in k for k in keys)
    base, tok = load_policy(fast_cfg(*overrides[1:]), progress=False)  # same seed: same base
    peft = PeftModel.from_pretrained(base, ckpt).eval()
    t.model.eval()
    trained = _logits(t.model, tok)
    assert torch.allclose(_logits(peft, tok), trained, atol=1e-6)
    out = tmp_path / "exported"
    args = [f"run.dir={tmp_path / 'x'}", *(f"{o}" for o in [*FAST_FOR_CLI, *overrides])]
    assert cli(["export", "--checkpoint", str(ckpt), "--out", str(out), *args]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert torch.allclose(_logits(merged, tok), trained, atol=1e-5)
    assert "AutoModelForCausalLM.from_pretrained" in capsys.readouterr().out


FAST_FOR_CLI = ["model.path=tiny-random", "run.progress=false", "run.threads=1"]
