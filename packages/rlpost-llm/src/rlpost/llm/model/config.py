"""The policy model's config section (``model``): what to load, its dtype, LoRA, and how
the trainer computes log-probs (:mod:`rlpost.llm.model.policy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlpost.core.contract import Property, Switch
from rlpost.core.io import schema
from rlpost.core.io.schema import Strict as _Strict


class LoraConfig(schema.LoraConfig):
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelConfig(_Strict):
    path: str = "tiny"
    """"tiny": the embedded default pretrained on the task (built and cached on first use);
    "tiny-bpe": the same built with a BPE tokenizer and a Llama (another model family);
    "tiny-feedback": the same, half its pre-training problems shown after a wrong attempt's
    verifier feedback (a base that can read feedback, for FBOS-RL);
    "tiny-reflect": "tiny-feedback" with a quarter of its problems replaced by failed
    attempts and the lesson of their diagnosis (a base that can also write one, for
    RubricEM's reflection meta-policy);
    with ``data.env``, "tiny" is that environment's base (SFT on its demonstrations);
    "tiny-random": the character architecture, untrained (tests); else a local path or hub
    id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig | None = None
    train_layers: list[int] | None = None
    """Only these decoder layers train (their every weight); the embeddings, the other
    layers, the final norm and the head stay frozen (layer-wise RL, 004-23's layer
    contribution: ``rlpost-llm layers``). None: every weight."""

    @model_validator(mode="after")
    def _layers_or_lora(self) -> ModelConfig:
        if self.train_layers is not None and self.lora is not None:
            raise ValueError("model.train_layers and model.lora are exclusive")
        return self

    @field_validator("path")
    @classmethod
    def _local_folder(cls, path: str) -> str:
        check_local_model(path)
        return path

    logprob_impl: Literal["auto", "fused", "logits"] = "auto"
    """How log-probs / entropy are computed from the model: ``fused`` (decoder hidden states
    + LM-head weight through rlpost.kernels, no [B, L, V] logits), ``logits`` (the model's
    logits, chunked), ``auto`` (fused when the head is a plain linear layer)."""
    pack_prompts: bool = True
    """Pack the responses of a micro-batch that share a prompt into one sequence per prompt
    (``[prompt; r_1; ...; r_N]`` with a 4D attention mask, rlpost.kernels shared_prompt):
    the prompt is processed once instead of N times. Needs a model that accepts 4D masks."""
    batch_invariant: bool = False
    """Score and train each row in a forward of its own (concatenated per micro-batch): a
    row's float32 log-probs are then bitwise the same at any micro-batch size and in the
    training forward as in the no-grad scoring (the ratio is exactly 1 on-policy). Off,
    rows share forwards (packed, padded) and differ by float rounding (about 0.5 ulp-level
    differences on a third to a half of the tokens, 4.8e-7 at most, in float32 on CPU).
    Costs one forward per row."""
    pack_min_gain: float = Field(1.2, ge=0)
    """Pack a micro-batch only when the padded layout would cost at least this many times
    the packed one (FLOPs modelled from the layout's positions and attended pairs,
    ``rlpost.llm.model.policy.layout_costs``); below it the padded layout is used. At
    8-token prompts and 128-token full-length responses packing saves 5 % of the positions
    and was 0.90-0.92x the padded update's speed (``tools/bench_packing.py --prompt 8
    --response 128``, ``docs/results/packing_p8_r128_2026-12-06.json``); at 256-token
    prompts it saves 2.5-4x. 0: always pack."""
    fused_ops: bool = False
    """Route the decoder's RMSNorms and SiLU-gated MLP activations (Llama / Mistral / Qwen2
    / Qwen3) through ``rlpost.kernels.ops.rms_norm`` and ``rlpost.kernels.ops.swiglu``: one
    Triton pass forward and one backward each on CUDA (elsewhere the same math as
    transformers', bit for bit). Off by default until measured on a GPU
    (``tools/gpu_check.py``'s kernel table and trainer step time them)."""
    pack_layout: Literal["auto", "ragged", "uniform"] = "auto"
    """``ragged``: each response keeps only its own tokens and several groups share a packed
    row (no padding computed), attention through the model's own implementation with a
    dense per-row mask (a group longer than two of its sequences is split, its prompt
    repeated); ``uniform``: every response padded to the longest, one group per row, the
    prompt once, attention through the shared-prompt op (flash attention on CPU, Triton on
    CUDA); ``auto`` (default): per micro-batch, whichever of the two the cost model puts
    lower (uniform for long shared prompts, ragged for short prompts and uneven
    responses)."""


PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_local_model(path: str) -> None:
    """A local model folder is refused at load, in one line, when it is missing, is not a
    Hugging Face folder, or holds its weights only as pickles (``pytorch_model.bin``):
    unpickling a file can run code, so weights load through safetensors only."""
    local = Path(path).expanduser()
    if not (path.startswith(("/", ".", "~")) or local.exists()):
        return  # a built-in name ("tiny", ...) or a hub id
    if not local.exists():
        raise ValueError(f"{path!r}: no such folder")
    if not local.is_dir():
        return
    if not any((local / m).exists() for m in ("config.json", "adapter_config.json")):
        raise ValueError(f"{path!r}: no config.json (not a Hugging Face model folder)")
    files = [f.name for f in local.iterdir() if f.is_file()]
    pickles = sorted(f for f in files if f.endswith(PICKLES))
    if pickles and not any(f.endswith(".safetensors") for f in files):
        raise ValueError(
            f"{path!r} holds its weights only as pickles ({', '.join(pickles[:3])}), which "
            "rlpost does not load (unpickling can run code): convert them once, where you "
            "trust the file, with AutoModelForCausalLM.from_pretrained(path)"
            ".save_pretrained(path, safe_serialization=True)"
        )


SWITCHES = (
    Switch.declare(
        "model.train_layers",
        lambda cfg: cfg.model.train_layers is not None,
        breaks={Property.FULL_WEIGHTS: "trains some decoder layers only"},
        example=["model.train_layers=[0]"],
    ),
    Switch.declare(
        "model.lora",
        lambda cfg: cfg.model.lora is not None,
        breaks={Property.FULL_WEIGHTS: "trains adapters on a frozen base"},
        example=["model.lora={r: 4}"],
    ),
)
