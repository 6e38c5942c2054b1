"""The rollout engine a config describes (``rollout``): vLLM, Ray rollout workers, a
compressed-KV engine, a speculative one, or the in-process lean / HF engine.

The options that replace the in-process engine (``rollout.workers``,
``rollout.kv_compression``, ``rollout.speculative``) are exclusive by their declarations
(:mod:`rlpost.llm.rollout.config`), checked when the config loads; a rollout source may
bring its own engine instead (BubbleSpec's draft verifier).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rlpost.core.io.rundir import notice
from rlpost.llm.rollout.engines import lean_unsupported, make_local_engine, make_vllm_engine
from rlpost.llm.rollout.engines.base import RolloutEngine


def _vllm(cfg: Any, model: torch.nn.Module, tok: Any, run_dir: Path, merged) -> RolloutEngine:
    """vLLM from a loadable copy of the initial weights in the run directory (merged); for
    a LoRA policy the frozen base's, and vLLM serves the adapters, which are all that each
    sync sends (``VLLMEngine.update_adapter``)."""
    from safetensors.torch import save_file

    path = run_dir / "vllm-init"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.save_pretrained(path)
    lora = {}
    if hasattr(model, "peft_config"):  # vLLM holds the frozen base, each sync the adapters
        rank = model.peft_config[model.active_adapter].r
        lora = {"lora_rank": int(rank), "lora_dir": str(run_dir / "vllm-lora")}
        weights = {  # the base without the adapters (a resumed run's are trained)
            k.replace("base_model.model.", "", 1).replace(".base_layer", ""): v.detach()
            for k, v in model.state_dict().items()
            if "lora_" not in k
        }
    else:
        weights = merged(model)
    sd = {k: v.clone().contiguous() for k, v in weights.items()}
    save_file(sd, str(path / "model.safetensors"))
    tok.save_pretrained(path)
    eng = make_vllm_engine(
        str(path), gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization, **lora
    )
    if lora:
        eng.update_adapter(model, 0)
    else:
        eng.update_weights(merged(model), 0)
    return eng


def _speculative(cfg: Any, model: torch.nn.Module, tok: Any, own_copy: bool) -> RolloutEngine:
    """Lossless speculative decoding: an early-exit draft of the policy, or a draft model."""
    from rlpost.llm.rollout.engines.speculative import SpeculativeEngine

    spec = cfg.rollout.speculative
    draft = spec.draft
    if isinstance(draft, str):
        from transformers import AutoModelForCausalLM

        try:
            draft = AutoModelForCausalLM.from_pretrained(draft, dtype=model.dtype)
        except OSError as exc:
            raise ValueError(f"rollout.speculative.draft {draft!r}: {exc}") from exc
        draft = draft.to(next(model.parameters()).device)
    return SpeculativeEngine(model, tok, draft, k=spec.k, own_copy=own_copy)


def make_engine(
    cfg: Any,
    model: torch.nn.Module,
    tok: Any,
    run_dir: Path,
    merged,
    *,
    own_copy: bool,
    say: bool = True,
) -> RolloutEngine:
    """The engine of ``cfg`` over ``model``. ``merged``: the model's full weights for an
    external engine (LoRA merged); ``own_copy``: the engine holds its own weights (an
    overlapped pipeline's snapshot, FSDP2's whole copy); ``say``: print notices."""
    r = cfg.rollout
    if r.engine == "vllm":
        return _vllm(cfg, model, tok, run_dir, merged)
    if r.workers:
        from rlpost.llm.rollout.engines.ray_workers import RayRolloutEngine

        eng = RayRolloutEngine(model, tok, r.workers, engine=r.engine, address=r.ray_address)
        eng.update_weights(merged(model), 0)
        return eng
    if r.kv_compression is not None:
        from rlpost.llm.rollout.engines.kv_compressed import KVCompressedEngine

        kv = r.kv_compression
        return KVCompressedEngine(model, tok, kv.sink, kv.window, own_copy=cfg.train.overlapped)
    if r.speculative is not None:
        return _speculative(cfg, model, tok, cfg.train.overlapped)
    why = lean_unsupported(model) if r.engine == "auto" else None
    if why is not None and say:
        notice(
            f"rollout.engine auto: the lean engine does not run this model ({why}); "
            "rollouts use transformers generate"
        )
    return make_local_engine(r.engine, model, tok, own_copy=own_copy, decode=r.lean_decode)


def sync_weights(engine: RolloutEngine, cfg: Any, model, learner, version: int, merged) -> None:
    """``engine`` on the policy's current weights, at ``version``: FSDP2's whole weights
    gathered (every rank takes part), a LoRA policy's adapters to an engine that takes them
    (Ray rollout workers, vLLM), a copy for an engine holding its own (vLLM: merged), else
    only the version (an engine sharing the policy's module)."""
    if learner.sharded:
        engine.update_weights(learner.full_state_dict(), version)
    elif hasattr(engine, "update_adapter") and hasattr(model, "peft_config"):
        engine.update_adapter(model, version)  # LoRA: the adapters alone after the first
    elif getattr(engine, "own_copy", True):
        whole = cfg.rollout.engine == "vllm" or getattr(engine, "merged_weights", False)
        engine.update_weights(merged(model) if whole else model.state_dict(), version)
    else:
        engine.update_weights({}, version)
