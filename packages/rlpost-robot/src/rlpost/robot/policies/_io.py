"""One on-disk layout for every robot policy: ``model.safetensors`` (the state dict) and
``config.json`` (what rebuilds the module, with a ``kind`` tag). No pickle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn


def save_policy(module: nn.Module, path_dir: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``module``'s state dict and ``meta`` (JSON types) into ``path_dir``."""
    from safetensors.torch import save_file

    path = Path(path_dir)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(meta, indent=1))
    return path


def read_policy(path_dir: str | Path, kind: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta without "kind", state dict)`` of a :func:`save_policy` folder; with ``kind``,
    a folder of another kind raises ``ValueError``."""
    from safetensors.torch import load_file

    path = Path(path_dir)
    meta = json.loads((path / "config.json").read_text())
    found = meta.pop("kind", "flow")
    if kind is not None and found != kind:
        raise ValueError(f"{path} holds a {found!r} policy, not a {kind!r} one (config.json kind)")
    return meta, load_file(str(path / "model.safetensors"))
