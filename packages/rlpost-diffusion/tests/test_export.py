"""``rlpost-diffusion export``: a run's SD3 LoRA in diffusers' format, loaded by
``pipe.load_lora_weights`` into a fresh pipeline, gives our policy's velocities."""

import pytest
import torch

from rlpost.diffusion.export import WEIGHTS, export_lora
from rlpost.diffusion.models.sd3 import LoraSpec, SD3Policy, build_tiny_sd3_pipeline


def _velocity(policy, prompts):
    torch.manual_seed(5)
    x = torch.randn(len(prompts), 4, 32, 32)
    sigma = torch.full((len(prompts),), 0.7)
    with torch.no_grad():
        return policy.velocity(x, sigma, policy.encode(prompts))


def test_an_exported_lora_loads_into_diffusers_and_matches_our_policy(tmp_path):
    """Before: checkpoints held peft's adapter names; load_lora_weights loaded nothing."""
    policy = SD3Policy(build_tiny_sd3_pipeline(), lora=LoraSpec(r=4, alpha=8))  # scale 2
    torch.manual_seed(1)
    with torch.no_grad():  # trained adapters: B is no longer 0
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    prompts = ["a red square", "a blue circle"]
    ours = _velocity(policy, prompts)
    out = export_lora(policy, tmp_path / "lora")
    assert (out / WEIGHTS).is_file()
    base = SD3Policy(build_tiny_sd3_pipeline(), lora=None)
    plain = _velocity(base, prompts)
    assert not torch.allclose(plain, ours, atol=1e-4)  # the adapters change the output
    base.pipeline.load_lora_weights(str(out))
    torch.testing.assert_close(_velocity(base, prompts), ours, rtol=1e-5, atol=1e-5)


def test_export_refuses_what_has_no_diffusers_lora(tmp_path):
    from rlpost.core.io.config import ConfigError
    from rlpost.diffusion.config import load_config
    from rlpost.diffusion.export import export_checkpoint

    with pytest.raises(ConfigError, match=r"model.name='digits' is rlpost's own network"):
        export_checkpoint(load_config(None, []), tmp_path / "ckpt", tmp_path / "out")
    full = SD3Policy(build_tiny_sd3_pipeline(), lora=None)
    with pytest.raises(ConfigError, match="no LoRA adapters"):
        export_lora(full, tmp_path / "out")


def test_the_export_command_writes_a_checkpoints_lora(tmp_path, capsys):
    from rlpost.apps.diffusion.cli import main
    from rlpost.core.io.checkpoint import save_checkpoint

    build_tiny_sd3_pipeline().save_pretrained(tmp_path / "sd3")
    policy = SD3Policy.from_pretrained(str(tmp_path / "sd3"), lora=LoraSpec(r=8, alpha=16))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    module = policy.trainable_module()
    opt = torch.optim.AdamW(policy.trainable_parameters())
    ckpt = save_checkpoint(tmp_path / "ckpts", 3, module, opt, None, {}, trainable_only=True)
    run = [
        "--config",
        "flow_grpo_sd3",
        f"model.path={tmp_path / 'sd3'}",
        "model.dtype=float32",
        "model.lora={r: 8, alpha: 16}",
        "reward.name=hackable",
    ]  # the run's settings
    args = ["export", *run, "--checkpoint", str(ckpt), "--out", str(tmp_path / "lora")]
    assert main(args) == 0
    assert f"pipe.load_lora_weights('{tmp_path / 'lora'}')" in capsys.readouterr().out
    fresh = SD3Policy.from_pretrained(str(tmp_path / "sd3"), lora=None)
    fresh.pipeline.load_lora_weights(str(tmp_path / "lora"))
    prompts = ["a red square"]
    torch.testing.assert_close(_velocity(fresh, prompts), _velocity(policy, prompts))
