"""PUST (004-04) on checkpoints: ``rlpost-llm pust``.

The proxy is a run: its relative improvement is its checkpoint (the latest, or the one
given) minus its initial weights (its ``config.yaml``'s ``model.path``). The primary is a
model folder that ``from_pretrained`` loads, or a run's checkpoint. The primary plus
``alpha`` times the improvement is written as a ``from_pretrained`` folder with
``pust.json`` (the update's norm and the tensors it touched). The two must match tensor
for tensor: a different architecture, or a different width, is refused in one line
naming the first mismatched tensor (weight-space transfer has no map between widths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlpost.core.update_transfer import relative_update, transfer
from rlpost.llm.tools.weights import checkpoint_of, matching, run_base, save_folder


def _primary(source: str | Path) -> tuple[Any, Any, dict]:
    """The primary's model (for its class and config), tokenizer and state."""
    from safetensors.torch import load_file

    p = Path(source)
    if (p / "config.yaml").is_file() or (p / "checkpoints").is_dir():  # a run
        _, model, tok = run_base(checkpoint_of(p)[0], "pust")
        return model, tok, load_file(str(checkpoint_of(p)[1] / "model.safetensors"))
    if (p / "manifest.json").is_file() and (p / "state.json").is_file():  # a run's checkpoint
        _, model, tok = run_base(p.parent.parent, "pust")
        return model, tok, load_file(str(p / "model.safetensors"))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(p)
        tok = AutoTokenizer.from_pretrained(p)
    except (OSError, ValueError) as exc:
        raise ValueError(f"pust: the primary {source}: {str(exc).splitlines()[0]}") from None
    return model, tok, dict(model.state_dict())


def pust(proxy: str | Path, primary: str | Path, out: str | Path, alpha: float = 1.0) -> dict:
    """Transfer the proxy run's improvement to the primary; write and report."""
    from safetensors.torch import load_file

    run, ckpt = checkpoint_of(proxy)
    _, proxy_model, _ = run_base(run, "pust")
    update = relative_update(proxy_model.state_dict(), load_file(str(ckpt / "model.safetensors")))
    model, tok, state = _primary(primary)
    matching(state, update, f"pust: the proxy {ckpt} against the primary {primary}")
    moved = transfer({k: state[k] for k in update}, update, alpha)
    folder = save_folder(model, tok, moved, Path(out))
    norm = sum(float((d.double() ** 2).sum()) for d in update.values()) ** 0.5
    report = {"proxy": str(ckpt), "primary": str(primary), "alpha": alpha,
              "update_norm": norm, "tensors": len(update), "written": str(folder)}  # fmt: skip
    (folder / "pust.json").write_text(json.dumps(report, indent=1))
    return report
