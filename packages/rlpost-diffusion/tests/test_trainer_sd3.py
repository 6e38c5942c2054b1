"""The trainer end to end on a tiny random SD3 pipeline with LoRA (built offline)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlpost.diffusion.config import load_config
from rlpost.diffusion.models.sd3 import SD3Policy, build_tiny_sd3_pipeline
from rlpost.diffusion.recipes import recipe_path
from rlpost.diffusion.trainer import Trainer


def red_reward(images, prompts):
    """Redness of the decoded image (a stand-in for an aesthetic / OCR model)."""
    return images[:, 0].mean((1, 2)) - images[:, 1:].mean((1, 2, 3))


@pytest.mark.parametrize("method", ["flow_grpo", "ram"])
def test_sd3_lora_trains_checkpoints_adapters_and_resumes(tmp_path, method):
    overrides = [
        "model.path=tiny-offline",  # the policy is passed in; the path is not loaded
        "reward.name=hackable",  # the recipe's placeholder; the reward is passed in
        "prompts.prompts=[a red square, a blue circle]",
        "prompts.per_step=2",
        "prompts.group_size=2",
        "sampler.steps=2",
        "sampler.eval_steps=2",
        "sampler.shift=3.0",
        "optim.micro_batch_size=2",
        "algo.renoise_k=1",
        "train.steps=1",
        "run.eval_every=1",
        "run.eval_per_prompt=1",
        "run.save_every=1",
        "run.progress=false",
        "run.tensorboard=false",
        f"run.dir={tmp_path}",
    ]
    cfg = load_config(recipe_path(f"{method}_sd3"), overrides)
    torch.manual_seed(0)
    policy = SD3Policy(build_tiny_sd3_pipeline(), guidance_scale=1.0)
    lora = {n: p.detach().clone() for n, p in policy.transformer.named_parameters() if "lora" in n}
    rows = Trainer(cfg, policy=policy, reward=red_reward, metrics={}).train(resume=False)
    assert rows[-1]["step"] == 1 and "eval/vnorm_ratio" in rows[-1]
    changed = [
        n
        for n, p in policy.transformer.named_parameters()
        if n in lora and not torch.equal(p, lora[n])
    ]
    assert changed, "no LoRA weight moved"
    stored = load_file(str(tmp_path / "checkpoints" / "step-000001" / "model.safetensors"))
    assert stored and all("lora" in k for k in stored)  # adapters only, not the base
    # resume on a fresh pipeline: the adapters come back from the checkpoint
    cfg2 = load_config(recipe_path(f"{method}_sd3"), [*overrides, "train.steps=2"])
    policy2 = SD3Policy(build_tiny_sd3_pipeline(), guidance_scale=1.0)
    Trainer(cfg2, policy=policy2, reward=red_reward, metrics={}).train(resume=True)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
