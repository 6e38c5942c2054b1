"""SD3Policy on a tiny random, offline SD3 pipeline (CPU, a few seconds after imports)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlpost.diffusion.models.base import FlowPolicy, cond_index, cond_repeat
from rlpost.diffusion.models.sd3 import (
    ADDED_KV_PROJECTIONS,
    LoraSpec,
    SD3Policy,
    build_tiny_sd3_pipeline,
)

torch.set_num_threads(1)

PROMPTS = ["a red cube", "two dogs on a beach", "x"]
RES = 32  # pixels -> 16x16 latents (vae_scale_factor 2): 256 image tokens


@pytest.fixture
def pipe():
    return build_tiny_sd3_pipeline()


def _inputs(policy: SD3Policy, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *policy.sample_shape, generator=g)
    sigma = torch.rand(n, generator=g) * 0.9 + 0.05
    return x, sigma


@torch.no_grad()
def _base_velocity(net, x, sigma, cond):
    """The unwrapped transformer, called the way StableDiffusion3Pipeline calls it."""
    return net(
        hidden_states=x,
        encoder_hidden_states=cond["prompt_embeds"],
        pooled_projections=cond["pooled"],
        timestep=sigma * 1000,
        return_dict=False,
    )[0]


def _step(policy: SD3Policy, x, sigma, cond, lr: float = 1e-2):
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=lr)
    loss = policy.velocity(x, sigma, cond).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_lora_starts_at_reference_and_training_moves_only_the_policy(pipe):
    base = copy.deepcopy(pipe.transformer)
    policy = SD3Policy(pipe, resolution=RES, max_sequence_length=16)
    cond = policy.encode(PROMPTS[:2])
    x, sigma = _inputs(policy, 2)

    v0, ref0 = policy.velocity(x, sigma, cond), policy.reference_velocity(x, sigma, cond)
    assert torch.equal(v0, ref0)  # LoRA B = 0
    assert torch.equal(ref0, _base_velocity(base, x, sigma, cond))

    _step(policy, x, sigma, cond)

    v1, ref1 = policy.velocity(x, sigma, cond), policy.reference_velocity(x, sigma, cond)
    assert not torch.allclose(v1, ref1)
    assert torch.equal(ref1, ref0)
    assert torch.equal(ref1, _base_velocity(base, x, sigma, cond))


def test_only_lora_weights_train_and_the_reference_has_no_grad(pipe):
    policy = SD3Policy(pipe, resolution=RES, max_sequence_length=16)
    named = dict(policy.transformer.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {id(p) for p in policy.trainable_parameters()} == {id(named[n]) for n in trainable}
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
        assert not any(p.requires_grad for p in getattr(pipe, name).parameters())

    cond = policy.encode(PROMPTS[:2])
    x, sigma = _inputs(policy, 2)
    for _ in range(2):  # second pass after a step: lora_B != 0, so lora_A gets gradient too
        opt = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
        v = policy.velocity(x, sigma, cond)
        # the reference pass in between toggles PEFT's adapters; v's graph must survive it
        ref = policy.reference_velocity(x, sigma, cond)
        assert not ref.requires_grad and ref.grad_fn is None
        assert all(named[n].requires_grad for n in trainable)
        ((v - ref).square().mean() + v.mean()).backward()
        grads = {n: named[n].grad for n in trainable}
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
        assert all(g.abs().sum() > 0 for n, g in grads.items() if ".lora_B." in n)
        opt.step()
        opt.zero_grad()
    assert all(g.abs().sum() > 0 for g in grads.values())
    assert all(p.grad is None for n, p in named.items() if n not in trainable)


def test_encode_batches_cond_that_indexes_and_repeats(pipe):
    policy = SD3Policy(pipe, resolution=RES, max_sequence_length=16)
    cond = policy.encode(PROMPTS)
    assert set(cond) == {"prompt_embeds", "pooled"}
    assert cond["prompt_embeds"].shape == (3, 77 + 16, 32)  # CLIP 77 tokens + T5 16 tokens
    assert cond["pooled"].shape == (3, 64)
    assert not torch.allclose(cond["prompt_embeds"][0], cond["prompt_embeds"][1])

    sub = cond_index(cond, torch.tensor([2, 0]))
    assert torch.equal(sub["pooled"], cond["pooled"][[2, 0]])

    rep = cond_repeat(cond, 2)  # [a, a, b, b, c, c]
    assert all(v.shape[0] == 6 for v in rep.values())
    x, sigma = _inputs(policy, 3)
    x, sigma = x.repeat_interleave(2, 0), sigma.repeat_interleave(2, 0)
    v = policy.velocity(x, sigma, rep)
    assert v.shape == (6, *policy.sample_shape) and v.dtype == torch.float32
    torch.testing.assert_close(v[0::2], v[1::2])
    torch.testing.assert_close(v[0::2], policy.velocity(x[0::2], sigma[0::2], cond))


def test_guidance_scale_applies_cfg_with_the_empty_prompt(pipe):
    base = copy.deepcopy(pipe.transformer)
    g = 4.5
    policy = SD3Policy(pipe, resolution=RES, max_sequence_length=16, guidance_scale=g)
    cond = policy.encode(PROMPTS)
    assert cond.keys() == {"prompt_embeds", "pooled", "negative_prompt_embeds", "negative_pooled"}
    assert all(v.shape[0] == 3 for v in cond.values())
    empty = SD3Policy(
        build_tiny_sd3_pipeline(), resolution=RES, max_sequence_length=16, lora=None
    ).encode([""])
    torch.testing.assert_close(cond["negative_pooled"], empty["pooled"].expand(3, -1))

    sub = cond_index(cond, slice(1, 3))
    x, sigma = _inputs(policy, 2)
    uncond = {"prompt_embeds": sub["negative_prompt_embeds"], "pooled": sub["negative_pooled"]}
    v_c, v_u = _base_velocity(base, x, sigma, sub), _base_velocity(base, x, sigma, uncond)
    expected = v_u + g * (v_c - v_u)
    torch.testing.assert_close(policy.velocity(x, sigma, sub), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        policy.reference_velocity(x, sigma, sub), expected, rtol=1e-4, atol=1e-5
    )

    with pytest.raises(KeyError, match="negative"):
        policy.velocity(x, sigma, {"prompt_embeds": sub["prompt_embeds"], "pooled": sub["pooled"]})


def test_decode_gives_images_in_unit_range(pipe):
    policy = SD3Policy(pipe, resolution=RES)
    x, _ = _inputs(policy, 2)
    img = policy.decode(x * 3)
    assert img.shape == (2, 3, RES, RES) and img.dtype == torch.float32
    assert img.min() >= 0 and img.max() <= 1 and img.std() > 0

    vae = pipe.vae  # same latent normalisation as StableDiffusion3Pipeline.__call__
    raw = vae.decode(x / vae.config.scaling_factor + vae.config.shift_factor).sample
    torch.testing.assert_close(policy.decode(x), (raw / 2 + 0.5).clamp(0, 1))


def test_flow_policy_protocol_and_sample_shape(pipe):
    policy = SD3Policy(pipe)
    assert isinstance(policy, FlowPolicy)
    assert policy.sample_shape == (4, 32, 32)  # transformer sample_size (64 px images)
    assert policy.trainable_module() is pipe.transformer
    assert policy.shift == 3.0 and policy.num_train_timesteps == 1000
    assert SD3Policy(build_tiny_sd3_pipeline(), resolution=RES).sample_shape == (4, 16, 16)
    with pytest.raises(ValueError, match="divisible"):
        SD3Policy(build_tiny_sd3_pipeline(), resolution=33)


def test_full_finetune_keeps_a_frozen_reference_copy(pipe):
    policy = SD3Policy(pipe, lora=None, resolution=RES, max_sequence_length=16)
    params = list(pipe.transformer.parameters())
    assert len(policy.trainable_parameters()) == len(params)
    assert all(p.requires_grad for p in params)
    ref_net = policy._reference
    assert ref_net is not None and ref_net is not pipe.transformer
    assert not any(p.requires_grad for p in ref_net.parameters())
    snapshot = {k: v.clone() for k, v in ref_net.state_dict().items()}

    cond = policy.encode(PROMPTS[:2])
    x, sigma = _inputs(policy, 2)
    ref0 = policy.reference_velocity(x, sigma, cond)
    assert torch.equal(policy.velocity(x, sigma, cond), ref0)
    _step(policy, x, sigma, cond, lr=1e-3)
    assert not torch.allclose(policy.velocity(x, sigma, cond), ref0)
    assert torch.equal(policy.reference_velocity(x, sigma, cond), ref0)
    assert all(torch.equal(v, snapshot[k]) for k, v in ref_net.state_dict().items())


def test_lora_spec_targets_and_low_precision_weights():
    pipe = build_tiny_sd3_pipeline().to(torch.bfloat16)
    with pytest.raises(ValueError, match="to_qq"):
        LoraSpec(target_modules=("to_qq",)).resolve_targets(pipe.transformer)

    spec = LoraSpec(r=4, alpha=4, added_kv=True)
    targets = spec.resolve_targets(pipe.transformer)
    # the single (last, context_pre_only) block has no to_add_out
    assert set(targets) == {"to_q", "to_k", "to_v", "to_out.0", *ADDED_KV_PROJECTIONS} - {
        "to_add_out"
    }
    policy = SD3Policy(pipe, lora=spec, resolution=RES, max_sequence_length=16)
    lora_names = {n for n, p in policy.transformer.named_parameters() if p.requires_grad}
    assert any(".add_k_proj.lora_A." in n for n in lora_names)
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    assert policy.transformer.proj_out.weight.dtype == torch.bfloat16
    cond = policy.encode(PROMPTS[:1])
    x, sigma = _inputs(policy, 1)
    v = policy.velocity(x, sigma, cond)
    assert v.dtype == torch.float32 and torch.equal(v, policy.reference_velocity(x, sigma, cond))


def test_from_pretrained_loads_a_local_checkpoint(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    policy = SD3Policy.from_pretrained(
        str(tmp_path), dtype="bfloat16", resolution=RES, local_files_only=True
    )
    assert policy.transformer.proj_out.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    cond = policy.encode(PROMPTS[:2])
    x, sigma = _inputs(policy, 2)
    assert policy.velocity(x, sigma, cond).shape == (2, *policy.sample_shape)
    with pytest.raises(ValueError, match="dtype"):
        SD3Policy.from_pretrained(str(tmp_path), dtype="float64")
