"""What the weight-space tools share (RELEX, SAR): a run's checkpoints, its initial
weights, tensors checked against the base, and a state written as a checkpoint folder
that ``AutoModelForCausalLM.from_pretrained`` and ``rlpost-llm eval --checkpoint`` load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor


def checkpoint_steps(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the run's checkpoints that hold weights, by step."""
    out = []
    for p in sorted((Path(run_dir) / "checkpoints").glob("step-*")):
        if (p / "model.safetensors").is_file():
            out.append((int(p.name.split("-")[1]), p))
    return out


def checkpoint_of(source: str | Path) -> tuple[Path, Path]:
    """``(run directory, checkpoint folder)`` of a run (its latest) or a checkpoint."""
    p = Path(source)
    if (p / "model.safetensors").is_file():
        return p.parent.parent, p
    steps = checkpoint_steps(p)
    if not steps:
        raise ValueError(f"{source}: neither a checkpoint folder nor a run with checkpoints")
    return p, steps[-1][1]


def run_base(run_dir: Path, what: str) -> tuple[Any, Any, Any]:
    """The run's config and its initial model and tokenizer (full weights only)."""
    from rlpost.llm.config import load_config
    from rlpost.llm.model.policy import is_peft, load_policy

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"{what}: {run_dir}: no config.yaml (not a run directory)")
    cfg = load_config(str(path), [])
    model, tok = load_policy(cfg, progress=False)
    if is_peft(model):
        raise ValueError(
            f"{what}: {run_dir} is a LoRA run, whose adapters are not linear in their factors; "
            "export merged checkpoints (rlpost-llm export) and use those"
        )
    return cfg, model, tok


def matching(base: dict[str, Tensor], other: dict[str, Tensor], what: str) -> None:
    """Refuse, in one line, a state whose tensors differ from the base's (the first one)."""
    for k, v in other.items():
        if k not in base:
            raise ValueError(f"{what}: tensor {k!r} is not in the base model")
        if tuple(base[k].shape) != tuple(v.shape):
            raise ValueError(
                f"{what}: tensor {k!r} is {tuple(v.shape)}, the base's {tuple(base[k].shape)}"
            )


def save_folder(model: Any, tok: Any, state: dict[str, Tensor], folder: Path) -> Path:
    """A copy of ``model`` with ``state``'s tensors (the checkpoint file's keys: loaded
    last, so a tied tensor takes their value) as a ``from_pretrained`` folder."""
    from safetensors.torch import save_model

    from rlpost.llm.model.policy import save_pretrained_files

    clone = type(model)(model.config)
    clone.load_state_dict(model.state_dict())
    clone.load_state_dict(state, strict=False)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(clone, str(folder / "model.safetensors"))
    save_pretrained_files(clone, tok, folder)
    return folder
