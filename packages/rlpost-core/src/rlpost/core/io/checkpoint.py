"""Atomic, pickle-free checkpoints: model, optimizer, scheduler, RNG and trainer state.

Layout of ``<run>/checkpoints/step-000010/``:

* ``model.safetensors`` — the module's state (shared / tied tensors handled);
* ``optimizer.safetensors`` + ``optimizer.json`` — per-parameter state tensors and the
  param groups (hyper-parameters);
* ``rng.safetensors`` — torch CPU (and CUDA) generator states;
* ``state.json`` — step, policy version, scheduler, data position, python RNG;
* ``<name>.safetensors`` (+ ``<name>-optimizer.*``) — each extra module of ``extras``
  (e.g. a critic with its own optimiser);
* ``tensors.safetensors`` — extra named state tensors (e.g. a regulariser's state);
* ``manifest.json`` — written last: the size and SHA-256 digest of every file above.

Everything is written into ``step-000010.tmp-<pid>`` and renamed into place, then the
``latest`` pointer is replaced atomically, so a run killed at any instant leaves either
the previous or the new checkpoint, never a torn one. Loading uses safetensors and JSON
only: no pickle, so an untrusted checkpoint cannot execute code.

:func:`find_checkpoint` picks the checkpoint to resume from: the newest one that
validates (:func:`validate_checkpoint`: the manifest's sizes and digests, so a flipped bit
is caught too, every safetensors header, every JSON file, the trainer state's shape),
whatever ``latest.json`` says, with a note for each newer one skipped;
:func:`quarantine` moves a damaged one aside (``step-000010.damaged``), so that it is never
tried again nor counted by the rotation, which keeps the newest ``keep`` checkpoints.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

#: safetensors metadata Hugging Face loaders require of a weights file.
PT = {"format": "pt"}


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _optimizer_tensors(
    opt: torch.optim.Optimizer, sd: dict | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict() if sd is None else sd
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{k}"] = v.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_dict(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The ``optimizer.state_dict()`` layout back from its saved tensors and metadata."""
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    for key, v in meta["scalars"].items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    return {"state": state, "param_groups": meta["param_groups"]}


def _load_optimizer(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    opt.load_state_dict(_optimizer_dict(tensors, meta))


def _save_optimizer(
    opt: torch.optim.Optimizer, folder: Path, stem: str, sd: dict | None = None
) -> None:
    tensors, meta = _optimizer_tensors(opt, sd)
    save_file(tensors, str(folder / f"{stem}.safetensors"))
    (folder / f"{stem}.json").write_text(json.dumps(meta))


def _optimizers(main: Any, extras: Mapping[str, tuple[Any, Any]] | None) -> list[Any]:
    return [o for o in (main, *(opt for _, opt in (extras or {}).values())) if o is not None]


def _keep_configured_lr(
    configured: list[tuple[Any, list[float]]], main: Any, scheduler: Any, step: int
) -> None:
    """The learning rates the run is configured with now win over the checkpoint's (the
    stop after a divergence says "lower optim.lr, then --resume"): each optimiser's groups
    get the configured rate, and the main one's ``LambdaLR`` continues its schedule from
    the new base. With unchanged rates nothing is touched: resume stays bitwise."""
    changed = []
    for opt, bases in configured:
        if opt is main and scheduler is not None and hasattr(scheduler, "lr_lambdas"):
            if list(scheduler.base_lrs) == bases:
                continue
            changed += [(a, b) for a, b in zip(scheduler.base_lrs, bases, strict=True) if a != b]
            scheduler.base_lrs = list(bases)
            for g, base, fn in zip(opt.param_groups, bases, scheduler.lr_lambdas, strict=True):
                g["initial_lr"] = base
                g["lr"] = base * fn(scheduler.last_epoch)
            continue
        for g, lr in zip(opt.param_groups, bases, strict=True):
            if g["lr"] != lr:
                changed.append((g["lr"], lr))
                g["lr"] = lr
    if changed:
        from rlpost.core.io.notice import notice

        pairs = ", ".join(f"{a:g} -> {b:g}" for a, b in changed)
        notice(
            f"from step {step + 1} the configured learning rate replaces the checkpoint's: {pairs}"
        )


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
    generators: Mapping[str, torch.Generator] | None = None,
    write_extra: Callable[[Path], None] | None = None,
    optimizer_state: dict | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; keep the newest ``keep``.

    ``optimizer_state``: the optimiser's state dict when ``optimizer.state_dict()`` is not
    the whole of it (a sharded learner's, gathered: ``rlpost.llm.train.parallel.Learner``).
    ``trainable_only``: store only the parameters with ``requires_grad`` (LoRA adapters on
    a frozen multi-billion-parameter base); the frozen rest comes from the base on load.
    ``extras``: further ``name -> (module, optimizer or None)`` pairs saved beside the
    model; ``tensors``: named state tensors (restore them with :func:`load_tensors`);
    ``generators``: named ``torch.Generator`` s besides the global one (a sampler's, an
    environment's), restored by :func:`load_checkpoint` given the same names;
    ``write_extra(folder)``: writes more files into the checkpoint before it is published
    (a domain's loader-native files: a Hugging Face ``config.json`` and tokenizer, PEFT
    adapters), covered by the manifest like the rest.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        return _write_checkpoint(
            root, step, final, tmp, model, optimizer, scheduler, state, keep, trainable_only,
            extras, tensors, generators, write_extra, optimizer_state,
        )  # fmt: skip
    except Exception as exc:
        if not _out_of_space(exc):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in checkpoint_dirs(root)]
        raise CheckpointWriteError(
            f"checkpoint {final.name} not written: no space left in {root}; "
            f"{'the checkpoints kept (' + ', '.join(kept) + ') are intact' if kept else 'no earlier checkpoint'}"
            ": free space, then --resume"
        ) from None


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written for want of space (the earlier ones are intact):
    the run stops with this one line (exit 3)."""

    one_line = True
    exit_code = 3


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _out_of_space(exc: BaseException) -> bool:
    """An ``OSError`` for a full disk or quota, or safetensors' error wrapping one."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    text = str(exc)
    return "No space left on device" in text or any(f"os error {e})" in text for e in _NO_SPACE)


def _write_checkpoint(
    root: Path,
    step: int,
    final: Path,
    tmp: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int,
    trainable_only: bool,
    extras: Mapping[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] | None,
    tensors: Mapping[str, torch.Tensor] | None,
    generators: Mapping[str, torch.Generator] | None,
    write_extra: Callable[[Path], None] | None,
    optimizer_state: dict | None,
) -> Path:
    tmp.mkdir()
    if trainable_only:
        save_file(_trainable_state(model), str(tmp / "model.safetensors"), metadata=PT)
    else:
        save_model(model, str(tmp / "model.safetensors"), metadata=PT)
    _save_optimizer(optimizer, tmp, "optimizer", optimizer_state)
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
    for name, gen in (generators or {}).items():
        rng[f"gen.{name}"] = gen.get_state()
    save_file(rng, str(tmp / "rng.safetensors"))
    full_state = {
        "step": step,
        "scheduler": scheduler.state_dict() if scheduler else None,
        "trainable_only": trainable_only,
        **state,
    }
    (tmp / "state.json").write_text(json.dumps(full_state, indent=1))
    if write_extra is not None:
        write_extra(tmp)
    files = sorted(tmp.iterdir())
    manifest = {
        "step": step,
        "files": {f.name: f.stat().st_size for f in files},
        "sha256": {f.name: file_digest(f) for f in files},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for f in tmp.iterdir():  # make the files durable before the rename publishes them
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_json(root / "latest.json", {"step": step, "dir": final.name})
    rotate(root, final, keep)
    return final


def rotate(root: Path, newest: Path, keep: int) -> None:
    """Delete the checkpoints before ``newest`` beyond the ``keep - 1`` latest of them;
    never ``newest`` itself, nor one of a higher step (a run restarted below a damaged
    checkpoint must not delete its own new ones)."""
    step = int(_STEP_DIR.match(newest.name).group(1))
    older = [p for p in reversed(checkpoint_dirs(root)) if int(p.name[5:]) < step]
    for old in older[: max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)


MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"step-(\d+)$")
#: what every checkpoint holds (a manifest may list more)
REQUIRED = ("model.safetensors", "state.json", "rng.safetensors", "optimizer.safetensors",
            "optimizer.json")  # fmt: skip


def file_digest(f: Path) -> str:
    """SHA-256 of ``f``'s bytes, hex."""
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def safetensors_problem(f: Path) -> str | None:
    """Why ``f`` is not a whole safetensors file (header and data), or None."""
    size = f.stat().st_size
    if size < 8:
        return f"{f.name} is {size} bytes"
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8:
            return f"{f.name} is truncated (header of {n} bytes in a {size}-byte file)"
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            return f"{f.name} has a garbled header"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{f.name} is truncated ({size} of {8 + n + end} bytes)"
    return None


def _manifest_problem(path: Path) -> str | None:
    """Whether the files the manifest lists are there, of their sizes and digests."""
    manifest = path / MANIFEST
    if not manifest.is_file():  # (checkpoints of older versions have none)
        return None
    try:
        m = json.loads(manifest.read_text())
        sizes, digests = dict(m["files"]), dict(m.get("sha256", {}))
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST} is garbled"
    for name, size in sizes.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} is {f.stat().st_size} bytes, {size} were written"
    for name, digest in digests.items():
        if file_digest(path / name) != digest:
            return f"{name} does not match the digest it was written with (it changed since)"
    return None


def _file_problem(f: Path) -> str | None:
    """Whether a safetensors file is whole, a JSON file parses (``state.json``: a trainer
    state with an integer step)."""
    if f.suffix == ".safetensors":
        return safetensors_problem(f)
    if f.suffix != ".json":
        return None
    try:
        obj = json.loads(f.read_text())
    except ValueError:
        return f"{f.name} is not valid JSON" + (" (empty)" if not f.read_text() else "")
    if f.name == "state.json" and not (isinstance(obj, dict) and isinstance(obj.get("step"), int)):
        return "state.json is not a trainer state (no integer step)"
    return None


def validate_checkpoint(path: Path) -> str | None:
    """Why checkpoint folder ``path`` cannot be resumed from, or None when it is whole:
    the sizes and digests its manifest lists, the files every checkpoint holds, every
    safetensors file's header and length, every JSON file's syntax."""
    path = Path(path)
    if not path.is_dir():
        return "missing"
    problem = _manifest_problem(path)
    if problem:
        return problem
    for req in REQUIRED:
        if not (path / req).is_file():
            return f"{req} is missing"
    for f in sorted(path.iterdir()):
        problem = _file_problem(f)
        if problem:
            return problem
    return None


def checkpoint_dirs(root: Path) -> list[Path]:
    """The finished ``step-*`` folders under ``root``, newest first."""
    if not Path(root).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(root).iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True) if p.is_dir()]


def find_checkpoint(root: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint under ``root`` that validates, and a note for every newer
    one skipped (and for a ``latest.json`` that is garbled or names a missing folder)."""
    found, _, notes = scan_checkpoints(root)
    return found, notes


def scan_checkpoints(root: Path) -> tuple[Path | None, list[Path], list[str]]:
    """:func:`find_checkpoint`, and the damaged checkpoints newer than the one found."""
    root = Path(root)
    notes: list[str] = []
    damaged: list[Path] = []
    pointer = root / "latest.json"
    if pointer.is_file():
        try:
            named = json.loads(pointer.read_text())["dir"]
            if not (root / named).is_dir():
                notes.append(f"latest.json names {named}, which does not exist")
        except (ValueError, KeyError, TypeError):
            notes.append("latest.json is garbled")
    for path in checkpoint_dirs(root):
        problem = validate_checkpoint(path)
        if problem is None:
            return path, damaged, notes
        damaged.append(path)
        notes.append(f"skipped {path.name}: {problem}")
    return None, damaged, notes


def quarantine(path: Path) -> Path:
    """Move damaged checkpoint ``path`` aside (``<name>.damaged``, numbered when taken):
    kept for inspection, never resumed from, never counted by the rotation."""
    target = path.with_name(f"{path.name}.damaged")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged{n}")
    os.replace(path, target)
    return target


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint under ``root`` that validates (see :func:`find_checkpoint`)."""
    return find_checkpoint(root)[0]


def remove_stale(root: Path) -> list[str]:
    """Delete what interrupted writes left under ``root`` (``*.tmp-<pid>`` folders and
    files); call it only while holding the run directory's lock. Returns their names."""
    root = Path(root)
    if not root.is_dir():
        return []
    stale = sorted(p for p in root.iterdir() if ".tmp-" in p.name)
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return [p.name for p in stale]


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
    generators: Mapping[str, torch.Generator] | None = None,
    load_model_state: Callable[[dict[str, torch.Tensor]], None] | None = None,
    load_optimizer_state: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Restore everything saved by :func:`save_checkpoint` (with the same ``extras`` and
    ``generators`` names); returns ``state.json``. ``load_model_state`` /
    ``load_optimizer_state``: load the saved weights / optimiser state dict in place of
    ``model.load_state_dict`` / ``optimizer.load_state_dict`` (a sharded learner)."""
    path = Path(path)
    configured = [  # the rates as configured now (a scheduler keeps the base in initial_lr)
        (o, [g.get("initial_lr", g["lr"]) for g in o.param_groups])
        for o in _optimizers(optimizer, extras)
    ]
    if load_model_state is None:
        state = load_weights(path, model)
    else:
        state = json.loads((path / "state.json").read_text())
        load_model_state(load_file(str(path / "model.safetensors")))
    if load_optimizer_state is None:
        _restore_optimizer(optimizer, path, "optimizer")
    else:
        load_optimizer_state(
            _optimizer_dict(
                load_file(str(path / "optimizer.safetensors")),
                json.loads((path / "optimizer.json").read_text()),
            )
        )
    for name, (module, opt) in (extras or {}).items():
        if not (path / f"{name}.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {path} has no {name}.safetensors")
        load_model(module, str(path / f"{name}.safetensors"), strict=True)
        if opt is not None:
            _restore_optimizer(opt, path, f"{name}-optimizer")
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    _keep_configured_lr(configured, optimizer, scheduler, int(state.get("step", 0)))
    rng = load_file(str(path / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda"))]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    for name, gen in (generators or {}).items():
        if f"gen.{name}" not in rng:
            raise FileNotFoundError(f"checkpoint {path} has no state of generator {name!r}")
        gen.set_state(rng[f"gen.{name}"])
    return state
