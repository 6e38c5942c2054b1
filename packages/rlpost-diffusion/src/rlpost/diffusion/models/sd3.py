"""Stable Diffusion 3 (and 3.5) as a :class:`~rlpost.diffusion.models.base.FlowPolicy`.

:class:`SD3Policy` wraps a diffusers ``StableDiffusion3Pipeline``: the MMDiT transformer is the
velocity field (LoRA-adapted by default, or fully fine-tuned), the three text encoders give the
conditioning and the VAE decodes latents to images. Everything except the trainable parameters
is frozen.

Convention: SD3's transformer, called with ``timestep = sigma * num_train_timesteps`` (1000),
predicts ``eps - x0`` for ``x_sigma = (1 - sigma) x0 + sigma eps`` -- exactly the velocity of
``base.py``. This is what diffusers' ``FlowMatchEulerDiscreteScheduler`` assumes: it sets
``timesteps = sigmas * num_train_timesteps``, noises with ``scale_noise``:
``sigma * noise + (1 - sigma) * sample`` and steps with
``prev_sample = sample + (sigma_next - sigma) * model_output`` (diffusers 0.42). The scheduler's
``shift`` (3.0 for SD3) only reshapes the sigma schedule; it is exposed as :attr:`SD3Policy.shift`
for samplers that want the model's native schedule.

Conditioning: ``{"prompt_embeds": [B, 77 + max_sequence_length, D], "pooled": [B, P]}``, plus
``"negative_prompt_embeds"`` / ``"negative_pooled"`` (the empty prompt, one row per prompt) when
``guidance_scale > 1``, so every key keeps the batch on dim 0.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlpost.diffusion.models.base import Cond

if TYPE_CHECKING:
    from diffusers import StableDiffusion3Pipeline
    from peft import LoraConfig

#: text-stream projections of SD3's joint attention (absent from ``attn2`` and, for
#: ``to_add_out``, from the last, ``context_pre_only`` block)
ADDED_KV_PROJECTIONS = ("add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FROZEN_COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae", "image_encoder")


def _matches(name: str, target: str) -> bool:
    """PEFT's rule for a string target: the module name equals it or ends with ``.target``."""
    return name == target or name.endswith("." + target)


@dataclass(frozen=True)
class LoraSpec:
    """LoRA on the transformer's attention projections (``B = 0`` at init, so ``v == v_ref``).

    ``target_modules`` are PEFT name suffixes; each must match a ``nn.Linear`` of the
    transformer. ``added_kv`` also adapts the text-stream projections
    (:data:`ADDED_KV_PROJECTIONS`) wherever the model has them. Adapter weights are kept in
    float32 even when the transformer is bf16/fp16.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
    added_kv: bool = False

    def resolve_targets(self, module: nn.Module) -> list[str]:
        """The target suffixes to adapt in ``module``; raises on one that matches no Linear."""
        linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
        missing = [t for t in self.target_modules if not any(_matches(n, t) for n in linears)]
        if missing:
            raise ValueError(f"LoRA target_modules {missing} match no nn.Linear of the model")
        targets = list(self.target_modules)
        if self.added_kv:
            targets += [
                t
                for t in ADDED_KV_PROJECTIONS
                if t not in targets and any(_matches(n, t) for n in linears)
            ]
        return targets

    def config(self, module: nn.Module) -> LoraConfig:
        """The ``peft.LoraConfig`` for ``module`` (default init: ``A`` random, ``B = 0``)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.resolve_targets(module),
            init_lora_weights=True,
        )


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _dtype_kwarg() -> str:
    """diffusers' ``from_pretrained`` takes ``dtype=`` since ``torch_dtype=`` was deprecated
    (0.42); older releases only know ``torch_dtype=``."""
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


def _base_weight(net: nn.Module) -> Tensor:
    """A base-model parameter, giving the device/dtype inputs must be cast to (LoRA is fp32)."""
    return next(p for n, p in net.named_parameters() if "lora_" not in n)


class SD3Policy:
    """SD3 / SD3.5 flow policy over VAE latents ``[C, H / vae_scale, W / vae_scale]``.

    With a :class:`LoraSpec` (default) only the LoRA weights train and ``v_ref`` is the same
    transformer with its adapters disabled (no second copy in memory). With ``lora=None`` the
    whole transformer trains and ``v_ref`` is a frozen deep copy of it.

    ``guidance_scale > 1`` makes both ``velocity`` and ``reference_velocity`` classifier-free
    guided, ``v = v_u + g (v_c - v_u)`` with the empty-prompt embeddings (one batched forward
    over ``[uncond; cond]``, as the pipeline does). ``resolution`` is the image side in pixels
    (default: the transformer's native ``sample_size`` times the VAE scale). Inputs are cast
    to the transformer's device/dtype; velocities come back float32 on ``x``'s device.
    """

    def __init__(
        self,
        pipeline: StableDiffusion3Pipeline,
        lora: LoraSpec | None = LoraSpec(),
        guidance_scale: float = 1.0,
        max_sequence_length: int = 77,
        resolution: int | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.lora = lora
        self.guidance_scale = float(guidance_scale)
        self.max_sequence_length = int(max_sequence_length)
        sched = pipeline.scheduler.config
        self.num_train_timesteps = int(sched.get("num_train_timesteps", 1000))
        #: the scheduler's sigma shift (SD3: 3.0); informational, samplers may use it
        self.shift = float(sched.get("shift", 1.0))

        cfg = self.transformer.config
        scale = int(pipeline.vae_scale_factor)
        if resolution is None:
            side = int(cfg.sample_size)
        else:
            if resolution % (scale * cfg.patch_size):
                raise ValueError(
                    f"resolution {resolution} must be divisible by vae_scale * patch_size "
                    f"= {scale * cfg.patch_size}"
                )
            side = resolution // scale
        latent_channels = pipeline.vae.config.latent_channels
        if latent_channels != cfg.in_channels:
            raise ValueError(
                f"VAE has {latent_channels} latent channels, transformer expects {cfg.in_channels}"
            )
        self.sample_shape: tuple[int, ...] = (int(cfg.in_channels), side, side)

        for name in _FROZEN_COMPONENTS:
            module = getattr(pipeline, name, None)
            if module is not None:
                module.requires_grad_(False).eval()

        self._reference: nn.Module | None = None
        if lora is None:
            self._reference = copy.deepcopy(self.transformer).requires_grad_(False).eval()
            self.transformer.requires_grad_(True)
        else:
            self.transformer.requires_grad_(False)
            # diffusers' PeftAdapterMixin: inject_adapter_in_model + set_adapter (marks LoRA
            # weights trainable); the weights follow the base dtype, so upcast like diffusers'
            # training scripts do (`cast_training_params`)
            self.transformer.add_adapter(lora.config(self.transformer))
            for n, p in self.transformer.named_parameters():
                p.requires_grad_("lora_" in n)
                if "lora_" in n and p.dtype != torch.float32:
                    p.data = p.data.float()
        self._trainable = [p for p in self.transformer.parameters() if p.requires_grad]

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        lora: LoraSpec | None = LoraSpec(),
        guidance_scale: float = 1.0,
        max_sequence_length: int = 77,
        resolution: int | None = None,
        **pipeline_kwargs: Any,
    ) -> SD3Policy:
        """Load a diffusers SD3 checkpoint (directory or hub id) and wrap it.

        ``pipeline_kwargs`` go to ``StableDiffusion3Pipeline.from_pretrained`` (e.g.
        ``variant="fp16"``, ``text_encoder_3=None`` to drop T5, ``local_files_only=True``).
        """
        from diffusers import StableDiffusion3Pipeline

        pipeline_kwargs[_dtype_kwarg()] = _torch_dtype(dtype)
        try:
            pipe = StableDiffusion3Pipeline.from_pretrained(path_or_id, **pipeline_kwargs)
        except OSError as exc:  # (EnvironmentError) a local folder mistyped, an unreachable Hub
            from pathlib import Path

            from rlpost.core.io.config import ConfigError

            if Path(path_or_id).expanduser().is_dir():
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"model.path: {path_or_id!r} is not a local folder, and as a Hub id it could "
                f"not be loaded ({first[:200]})"
            ) from None
        pipe.set_progress_bar_config(disable=True)
        if device is not None:
            pipe.to(device)
        return cls(
            pipe,
            lora=lora,
            guidance_scale=guidance_scale,
            max_sequence_length=max_sequence_length,
            resolution=resolution,
        )

    # --- FlowPolicy -------------------------------------------------------------------

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        """``v_theta(x, sigma, cond)``, differentiable w.r.t. :meth:`trainable_parameters`."""
        return self._velocity(self.transformer, x, sigma, cond)

    @torch.no_grad()
    def reference_velocity(self, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        """``v_ref``: the frozen copy, or the transformer with its adapters disabled."""
        if self._reference is not None:
            return self._velocity(self._reference, x, sigma, cond)
        # PEFT's enable/disable also flips requires_grad on adapter weights
        # (enable -> trainable); put back whatever the caller had.
        flags = [p.requires_grad for p in self._trainable]
        self.transformer.disable_adapters()
        try:
            return self._velocity(self.transformer, x, sigma, cond)
        finally:
            self.transformer.enable_adapters()
            for p, flag in zip(self._trainable, flags, strict=True):
                p.requires_grad_(flag)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> Cond:
        """Prompt embeddings from the pipeline's three text encoders (CLIP-L, CLIP-G, T5)."""
        cfg = self.guidance_scale > 1
        embeds, neg_embeds, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompt=list(prompts),
            prompt_2=None,
            prompt_3=None,
            do_classifier_free_guidance=cfg,
            max_sequence_length=self.max_sequence_length,
        )
        cond = {"prompt_embeds": embeds, "pooled": pooled}
        if cfg:
            cond |= {"negative_prompt_embeds": neg_embeds, "negative_pooled": neg_pooled}
        return cond

    @torch.no_grad()
    def decode(self, x: Tensor) -> Tensor:
        """Latents -> images in [0, 1]: undo the SD3 latent normalisation, VAE-decode."""
        vae = self.pipeline.vae
        shift = vae.config.shift_factor or 0.0
        latents = x.float() / vae.config.scaling_factor + shift  # as StableDiffusion3Pipeline
        weight = _base_weight(vae)
        image = vae.decode(latents.to(weight.device, weight.dtype), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self._trainable)

    def trainable_module(self) -> nn.Module:
        """The transformer (with its LoRA layers, if any); PEFT's
        ``get_peft_model_state_dict`` extracts just the adapter from it."""
        return self.transformer

    # --- internals ----------------------------------------------------------------------

    def _velocity(self, net: nn.Module, x: Tensor, sigma: Tensor, cond: Cond) -> Tensor:
        weight = _base_weight(net)
        device, dtype = weight.device, weight.dtype
        batch = x.shape[0]
        hidden = x.to(device, dtype)
        t = torch.as_tensor(sigma, device=device, dtype=torch.float32).reshape(-1).expand(batch)
        t = t * self.num_train_timesteps
        embeds, pooled = cond["prompt_embeds"], cond["pooled"]
        guided = self.guidance_scale > 1
        if guided:
            if "negative_prompt_embeds" not in cond:
                raise KeyError("guidance_scale > 1 needs the negative_* embeddings from encode()")
            # [uncond; cond] in one forward, like StableDiffusion3Pipeline.__call__
            hidden, t = torch.cat([hidden, hidden]), torch.cat([t, t])
            embeds = torch.cat([cond["negative_prompt_embeds"], embeds])
            pooled = torch.cat([cond["negative_pooled"], pooled])
        out = net(
            hidden_states=hidden,
            encoder_hidden_states=embeds.to(device, dtype),
            pooled_projections=pooled.to(device, dtype),
            timestep=t,
            return_dict=False,
        )[0].float()
        if guided:
            uncond, text = out.chunk(2)
            out = uncond + self.guidance_scale * (text - uncond)
        return out.to(x.device)


def build_tiny_sd3_pipeline(seed: int = 0) -> StableDiffusion3Pipeline:
    """A tiny random SD3 pipeline built offline, for tests and examples (CPU-fast).

    The transformer is the one of diffusers' SD3 pipeline tests (latent 4x32x32, one joint
    block, ``joint_attention_dim=32``, ``pooled_projection_dim=64``); two 16-wide CLIP text
    encoders (32-d projections, so pooled = 64) and a 32-wide T5 encoder; a two-level VAE
    (``vae_scale_factor = 2``, SD3's ``shift_factor``/``scaling_factor``). Tokenizers are
    character-level ``tokenizers`` BPEs (no merges) wrapped in ``PreTrainedTokenizerFast``,
    so nothing is downloaded. The global RNG state is left untouched.
    """
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    clip_tok = _char_tokenizer(
        ["<|startoftext|>", "<|endoftext|>", "<unk>"],
        template="<|startoftext|> $A <|endoftext|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=77,
    )
    t5_tok = _char_tokenizer(
        ["<pad>", "</s>", "<unk>"],
        template="$A </s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    clip_config = CLIPTextConfig(
        vocab_size=len(clip_tok),
        hidden_size=16,
        intermediate_size=37,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        bos_token_id=clip_tok.bos_token_id,
        eos_token_id=clip_tok.eos_token_id,  # != 2: pool at the first EOS, not argmax(ids)
        pad_token_id=clip_tok.pad_token_id,
    )
    t5_config = T5Config(
        vocab_size=len(t5_tok),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=t5_tok.pad_token_id,
        eos_token_id=t5_tok.eos_token_id,
        decoder_start_token_id=t5_tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = SD3Transformer2DModel(
            sample_size=32,
            patch_size=1,
            in_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=32,
            pooled_projection_dim=64,
            out_channels=4,
        )
        text_encoder = CLIPTextModelWithProjection(clip_config)
        text_encoder_2 = CLIPTextModelWithProjection(clip_config)
        text_encoder_3 = T5EncoderModel(t5_config)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            block_out_channels=(4, 8),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=1,
            sample_size=64,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=clip_tok,
        text_encoder_2=text_encoder_2.eval(),
        tokenizer_2=copy.deepcopy(clip_tok),
        text_encoder_3=text_encoder_3.eval(),
        tokenizer_3=t5_tok,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _char_tokenizer(specials: list[str], template: str, model_max_length: int, **tokens: str):
    """A lower-cased character-level fast tokenizer: special tokens first, then ASCII 33..126."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(specials)}
    for code in range(33, 127):
        vocab.setdefault(chr(code), len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, vocab[t]) for t in specials if t in template]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", model_max_length=model_max_length, **tokens
    )
