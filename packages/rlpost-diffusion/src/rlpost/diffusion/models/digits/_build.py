"""What the digits builders share: the cache version and paths, messages, grad mode and
the learning-rate schedule."""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlpost.core.io.cache import cache_entry, merge_params

log = logging.getLogger("rlpost.diffusion.models.digits")

#: Bumped whenever a recipe changes in a way that invalidates cached builds.
DIGITS_VERSION = 1


def hashed_path(cache_dir: str | os.PathLike | None, prefix: str, recipe: dict) -> Path:
    return cache_entry("diffusion", prefix, {**recipe, "version": DIGITS_VERSION}, cache_dir)


merge = merge_params


def is_complete(path: Path, info_name: str) -> bool:
    return (path / info_name).is_file()


def say(progress: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        log.info(msg)
        if progress:
            tqdm.write(msg, file=sys.stderr)

    return say


def with_grad(fn):
    """Run ``fn`` with autograd on and outside inference mode: builders and loaders may be
    called lazily from ``no_grad`` / ``inference_mode`` code (e.g. a reward's first call),
    and must still train, and create parameters that can later be differentiated through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.enable_grad():
            return fn(*args, **kwargs)

    return wrapper


def warmup_cosine(steps: int) -> Callable[[int], float]:
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
