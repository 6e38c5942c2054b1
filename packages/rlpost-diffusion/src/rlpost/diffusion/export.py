"""A run's SD3 LoRA in diffusers' format: ``pipe.load_lora_weights(folder)`` loads it.

:func:`export_lora` writes ``pytorch_lora_weights.safetensors`` with diffusers' own
``StableDiffusion3Pipeline.save_lora_weights`` (keys ``transformer.<module>.lora_A.weight``,
the adapter's rank and alpha in the file's metadata, so the scale comes back as trained);
:func:`export_checkpoint` does it for a checkpoint folder of ``rlpost-diffusion train``
(``rlpost-diffusion export``). The embedded digits model is rlpost's own network, not a
diffusers pipeline: it has nothing to export to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlpost.core.io.config import ConfigError

WEIGHTS = "pytorch_lora_weights.safetensors"


def export_lora(policy: Any, out: str | Path) -> Path:
    """``policy``'s transformer adapters (an :class:`~rlpost.diffusion.models.sd3.SD3Policy`
    with LoRA) written to folder ``out`` in diffusers' LoRA format; returns the folder."""
    from diffusers import StableDiffusion3Pipeline
    from peft.utils import get_peft_model_state_dict

    transformer = policy.transformer
    configs = getattr(transformer, "peft_config", None) or {}
    if not configs:
        raise ConfigError("export: the policy has no LoRA adapters (model.lora) to export")
    name = next(iter(configs))
    layers = get_peft_model_state_dict(transformer, adapter_name=name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    StableDiffusion3Pipeline.save_lora_weights(
        out, transformer_lora_layers=layers, weight_name=WEIGHTS,
        transformer_lora_adapter_metadata=configs[name].to_dict(),
    )  # fmt: skip
    return out


def export_checkpoint(cfg: Any, checkpoint: str | Path, out: str | Path) -> Path:
    """The LoRA of ``checkpoint`` (a ``checkpoints/step-XXXXXX`` folder of a run with
    ``cfg``) in diffusers' format in ``out``."""
    import torch

    from rlpost.core.io.checkpoint import load_weights
    from rlpost.diffusion.trainer import load_policy

    if cfg.model.name != "sd3":
        raise ConfigError(
            f"export: model.name={cfg.model.name!r} is rlpost's own network; diffusers' LoRA "
            "format exists for model.name=sd3 (an SD3 pipeline with model.lora)"
        )
    policy = load_policy(cfg, torch.device("cpu"))
    load_weights(Path(checkpoint), policy.trainable_module())
    return export_lora(policy, out)
