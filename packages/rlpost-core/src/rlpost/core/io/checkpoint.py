"""Atomic, pickle-free checkpoints: model, optimizer, scheduler, RNG and trainer state.

Layout of ``<run>/checkpoints/step-000010/``:

* ``model.safetensors`` — the module's state (shared / tied tensors handled);
* ``optimizer.safetensors`` + ``optimizer.json`` — per-parameter state tensors and the
  param groups (hyper-parameters);
* ``rng.safetensors`` — torch CPU (and CUDA) generator states;
* ``state.json`` — step, policy version, scheduler, data position, python RNG;
* ``<name>.safetensors`` (+ ``<name>-optimizer.*``) — each extra module of ``extras``
  (e.g. a critic with its own optimiser);
* ``tensors.safetensors`` — extra named state tensors (e.g. a regulariser's state).

Everything is written into ``step-000010.tmp-<pid>`` and renamed into place, then the
``latest`` pointer is replaced atomically, so a run killed at any instant leaves either
the previous or the new checkpoint, never a torn one. Loading uses safetensors and JSON
only: no pickle, so an untrusted checkpoint cannot execute code.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{k}"] = v.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _load_optimizer(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    for key, v in meta["scalars"].items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _save_optimizer(opt: torch.optim.Optimizer, folder: Path, stem: str) -> None:
    tensors, meta = _optimizer_tensors(opt)
    save_file(tensors, str(folder / f"{stem}.safetensors"))
    (folder / f"{stem}.json").write_text(json.dumps(meta))


def _restore_optimizer(opt: torch.optim.Optimizer, folder: Path, stem: str) -> None:
    _load_optimizer(
        opt,
        load_file(str(folder / f"{stem}.safetensors")),
        json.loads((folder / f"{stem}.json").read_text()),
    )


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k in names}


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int = 2,
    trainable_only: bool = False,
    extras: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; keep the newest ``keep``.

    ``trainable_only``: store only the parameters with ``requires_grad`` (LoRA adapters on
    a frozen multi-billion-parameter base); the frozen rest comes from the base on load.
    ``extras``: further ``name -> (module, optimizer or None)`` pairs saved beside the
    model; ``tensors``: named state tensors (restore them with :func:`load_tensors`).
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if trainable_only:
        save_file(_trainable_state(model), str(tmp / "model.safetensors"))
    else:
        save_model(model, str(tmp / "model.safetensors"))
    _save_optimizer(optimizer, tmp, "optimizer")
    for name, (module, opt) in (extras or {}).items():
        save_model(module, str(tmp / f"{name}.safetensors"))
        if opt is not None:
            _save_optimizer(opt, tmp, f"{name}-optimizer")
    if tensors:
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in tensors.items()},
            str(tmp / "tensors.safetensors"),
        )
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda{i}"] = s
    save_file(rng, str(tmp / "rng.safetensors"))
    full_state = {
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler else None,
        "trainable_only": trainable_only,
        **state,
    }
    (tmp / "state.json").write_text(json.dumps(full_state, indent=1))
    for f in tmp.iterdir():  # make the files durable before the rename publishes them
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_json(root / "latest.json", {"step": step, "dir": final.name})
    for old in sorted(p for p in root.glob("step-*") if p.is_dir() and ".tmp-" not in p.name)[
        :-keep
    ]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest.json"
    if not pointer.is_file():
        return None
    path = root / json.loads(pointer.read_text())["dir"]
    return path if path.is_dir() else None


def load_weights(path: Path, model: torch.nn.Module) -> dict[str, Any]:
    """Only the model weights of a checkpoint folder (all of them, or the trainable subset
    it was saved with); returns its ``state.json``."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors in checkpoint folder {path}")
    state = json.loads((path / "state.json").read_text())
    if state.get("trainable_only"):
        saved = load_file(str(path / "model.safetensors"))
        expected = set(_trainable_state(model))
        if set(saved) != expected:
            raise RuntimeError(
                f"checkpoint {path} does not match the model's trainable parameters: "
                f"missing {sorted(expected - set(saved))[:5]}, "
                f"unexpected {sorted(set(saved) - expected)[:5]}"
            )
        model.load_state_dict(saved, strict=False)
    else:
        load_model(model, str(path / "model.safetensors"), strict=True)
    return state


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The extra state tensors a checkpoint was saved with (empty when none)."""
    f = Path(path) / "tensors.safetensors"
    return load_file(str(f)) if f.is_file() else {}


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extras: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] | None = None,
) -> dict[str, Any]:
    """Restore everything saved by :func:`save_checkpoint` (with the same ``extras``
    names); returns ``state.json``."""
    path = Path(path)
    state = load_weights(path, model)
    _restore_optimizer(optimizer, path, "optimizer")
    for name, (module, opt) in (extras or {}).items():
        if not (path / f"{name}.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {path} has no {name}.safetensors")
        load_model(module, str(path / f"{name}.safetensors"), strict=True)
        if opt is not None:
            _restore_optimizer(opt, path, f"{name}-optimizer")
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    rng = load_file(str(path / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda"))]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    return state
