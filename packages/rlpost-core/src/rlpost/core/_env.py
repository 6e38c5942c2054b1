"""Report which optional engines a domain package can use (for the apps' ``doctor``), and
the error raised when a feature needs one that is not installed."""

from __future__ import annotations

import importlib.metadata as md
import os


class MissingDependency(ImportError, ValueError):
    """A feature needs an optional package that is not installed; the message says what to
    install. An ``ImportError`` to library code, a ``ValueError`` to the command-line apps,
    which print it as one line (exit 2) instead of a traceback."""


def versions(dists: list[str]) -> dict[str, str]:
    """Installed version of each distribution, or ``'not installed'``."""
    out = {}
    for d in dists:
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = "not installed"
    return out


def pick_device(name: str):
    """The ``torch.device`` of a run's ``device`` setting: ``"auto"`` is CUDA when a GPU is
    visible (``cuda:$LOCAL_RANK`` under ``torchrun``), else the CPU; otherwise any name
    torch accepts (``"cpu"``, ``"cuda"``, ``"cuda:1"``). An unknown name, or a CUDA device
    on a machine without one, raises ``ValueError`` naming it."""
    import torch

    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        name = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device {name!r}: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: no CUDA GPU is visible here (use cpu or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here"
            )
    return dev


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def fix_mmap_threshold(kib: int | None) -> bool:
    """Fix glibc's mmap and trim thresholds at ``kib`` KiB for this process
    (``run.malloc_mmap_kb``): a block below it comes from the heap, and freed memory at the
    heap's top is kept up to it; a block as large or larger gets a mapping of its own,
    returned to the system when freed. glibc's own thresholds (``None``) rise as blocks
    are freed, but never above 32 MiB: every larger tensor (an update's activations at
    long responses) is mapped afresh each time and pays a page fault per page. False where
    nothing was set (``None``, or a C library without ``mallopt``)."""
    if kib is None:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    size = int(kib) * 1024
    return bool(mallopt(M_MMAP_THRESHOLD, size)) and bool(mallopt(M_TRIM_THRESHOLD, size))
