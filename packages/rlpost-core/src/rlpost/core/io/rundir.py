"""The run directory every domain's trainer writes into, and its discipline.

:func:`open_run_dir` is the one way in:

* an exclusive lock (``<run>/.lock``, ``flock``): a second run in the same directory fails
  at once with :class:`RunDirError`, naming the process that holds it; the lock goes with
  the process, however it ends (a killed run leaves no stale lock), and a trainer releases
  it when its run has ended (:func:`unlock_run_dir`), so that a process that lives on (a
  notebook, a sweep) neither keeps finished runs' directories from other processes nor
  holds a descriptor per run;
* a directory that already holds a run (``metrics.jsonl`` or checkpoints) is refused
  unless the caller resumes it (``--resume``) or asks to replace it (``overwrite``);
* what interrupted writes left (``*.tmp-<pid>``) is removed;
* ``config.yaml`` is written atomically (a temporary file, then a rename).

:func:`notice` is how the run tells its user about a decision (which checkpoint it resumed
from, which it skipped): one line on stderr.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rlpost.core.io.notice import notice

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None  # type: ignore[assignment]

LOCK = ".lock"
#: The files and folders whose presence means "this directory holds a run".
RUN_OUTPUTS = ("metrics.jsonl", "checkpoints")
#: What ``overwrite`` deletes (a run's outputs; nothing else in the folder is touched).
REPLACED = ("metrics.jsonl", "checkpoints", "tensorboard", "wandb", "wandb-run-id", "experience")

_held: dict[str, int] = {}  # resolved path -> fd of the lock this process holds


class RunDirError(ValueError):
    """The run directory cannot be used as asked (locked, or holds a run)."""


def due(every: int, step: int, total: int) -> bool:
    """Whether a periodic action (evaluate, save) falls on ``step``: every ``every`` steps
    and at the last one (``total``); ``every = 0`` never."""
    return bool(every) and (step % every == 0 or step == total)


def _holder(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on {info['host']} (started {started}: {info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def lock_run_dir(run: str | os.PathLike) -> None:
    """Take ``run``'s exclusive lock until :func:`unlock_run_dir` or the end of this process
    (re-entrant within it: a second take is the same lock, and one release ends it).

    Raises :class:`RunDirError` naming the holder when another process has it."""
    key = str(Path(run).resolve())
    if key in _held or fcntl is None:
        return
    path = Path(run) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunDirError(
            f"run.dir {run} is in use by {_holder(path)}; wait for it to finish or choose "
            "another run.dir"
        ) from None
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[
            :200
        ],
    }
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(info).encode())
    _held[key] = fd


def unlock_run_dir(run: str | os.PathLike) -> None:
    """Release ``run``'s lock (once its run has ended; it goes anyway with the process).
    Nothing happens when this process does not hold it."""
    fd = _held.pop(str(Path(run).resolve()), None)
    if fd is not None:
        os.close(fd)


_F = TypeVar("_F", bound=Callable[..., Any])


def releases_run_dir(run_of: Callable[..., str | os.PathLike]) -> Callable[[_F], _F]:
    """Decorate a run's whole call (a trainer's ``train``): once it returns or raises, the
    lock of ``run_of(*its arguments)`` is released (:func:`unlock_run_dir`), so that the
    directory of a run that has ended is free for other processes."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                unlock_run_dir(run_of(*args, **kwargs))

        return run  # type: ignore[return-value]

    return wrap


def locked_here(run: str | os.PathLike) -> bool:
    """Whether this process holds ``run``'s lock."""
    return str(Path(run).resolve()) in _held


def holds_run(run: Path) -> list[str]:
    """The run outputs already in ``run`` (empty for a fresh or unused directory)."""
    found = []
    for name in RUN_OUTPUTS:
        p = Path(run) / name
        if (p.is_file() and p.stat().st_size > 0) or (p.is_dir() and any(p.iterdir())):
            found.append(name)
    return found


def make_run_dir(run: Path) -> None:
    """``mkdir -p`` with one line (:class:`RunDirError`) when a part of the path is a file or
    cannot be created."""
    for part in (run, *run.parents):
        if part.exists():
            if not part.is_dir():
                raise RunDirError(f"run.dir {run}: {part} is a file, not a directory")
            break
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"run.dir {run}: cannot create it ({exc.strerror})") from None


def open_run_dir(
    path: str | os.PathLike,
    config: Any,
    *,
    resume: bool = False,
    overwrite: bool = False,
    lock: bool = True,
) -> Path:
    """Create and lock ``path`` and write ``config.yaml`` (``config.to_yaml()``, a
    :class:`rlpost.core.io.schema.Strict` model) atomically.

    ``resume``: the caller continues the run it finds (its checkpoints are kept);
    ``overwrite``: the caller replaces it (``metrics.jsonl``, ``checkpoints/``,
    ``tensorboard/`` are deleted first). With neither, a directory that holds a run is
    refused with a message naming ``--resume``. Stale ``*.tmp-<pid>`` leftovers of
    interrupted writes are removed (under the lock, so none belongs to a live run).
    """
    from rlpost.core.pool import check_main_guard

    check_main_guard()  # a worker re-running the user's script must not start a run
    run = Path(path)
    make_run_dir(run)
    if lock:
        lock_run_dir(run)
    existing = holds_run(run)
    if existing and not resume:
        if not overwrite:
            raise RunDirError(
                f"run.dir {run} already holds a run ({', '.join(existing)}); pass --resume "
                "to continue it, or choose another run.dir"
            )
        for name in REPLACED:
            p = run / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    from rlpost.core.io.checkpoint import remove_stale

    stale = remove_stale(run) + remove_stale(run / "checkpoints")
    if (run / "config.yaml.tmp").exists():
        (run / "config.yaml.tmp").unlink()
    if stale:
        notice(f"removed {len(stale)} leftover(s) of interrupted writes in {run}: {stale[:3]}")
    tmp = run / f"config.yaml.tmp-{os.getpid()}"
    tmp.write_text(config.to_yaml())
    tmp.replace(run / "config.yaml")
    return run


def resume_checkpoint(run: str | os.PathLike) -> Path | None:
    """The checkpoint of ``run`` to resume from (the newest that validates, see
    :func:`rlpost.core.io.checkpoint.find_checkpoint`), telling the user which one and
    why newer ones were skipped; None (and a notice) when there is none. The skipped,
    damaged ones are moved aside (``step-*.damaged``): call it holding the run's lock."""
    from rlpost.core.io.checkpoint import quarantine, scan_checkpoints

    ckpt, damaged, notes = scan_checkpoints(Path(run) / "checkpoints")
    for note in notes:
        notice(f"{Path(run) / 'checkpoints'}: {note}")
    for path in damaged:
        notice(f"moved the damaged {path.name} aside: {quarantine(path).name}")
    if ckpt is None:
        notice(f"--resume: no valid checkpoint in {Path(run) / 'checkpoints'}; starting at step 0")
    else:
        step = json.loads((ckpt / "state.json").read_text()).get("step", "?")
        notice(f"resuming from {ckpt.name} (step {step}) in {ckpt.parent}")
    return ckpt
