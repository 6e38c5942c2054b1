"""The local build cache every domain's embedded default lives in.

``default_cache_dir()``: ``$RLPOST_CACHE`` if set, else the user cache directory
(``$XDG_CACHE_HOME/rlpost`` or ``~/.cache/rlpost``; ``~/Library/Caches/rlpost`` on macOS).
``publish_directory`` builds a cache entry in a temporary sibling folder and renames it
into place, so an interrupted build never leaves a half-written entry; ``cache_lock``
serialises builders of the same entry (pytest-xdist workers, parallel jobs), so it is built
once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: builds are not serialised (publish_directory stays atomic)
    fcntl = None  # type: ignore[assignment]


def default_cache_dir() -> Path:
    env = os.environ.get("RLPOST_CACHE")
    if env:
        return Path(env)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "rlpost"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlpost"


@contextlib.contextmanager
def cache_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on building cache entry ``target`` (another process that asks
    for the same entry waits, then finds it complete, instead of building it twice). The
    lock file lives in ``<root>/.locks``, beside the domain folders, never inside them."""
    if fcntl is None:
        yield
        return
    locks = target.parent.parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{target.parent.name}-{target.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def publish_directory(
    target: Path, marker: str, write: Callable[[Path], None], force: bool = False
) -> Path:
    """Run ``write(tmp)`` into a temporary sibling of ``target``, then rename it into place.

    ``marker`` is the file whose presence marks a complete entry; ``write`` must create it
    last. An existing complete ``target`` is replaced only with ``force`` (otherwise another
    process finished first and its entry is kept). Returns ``target``.
    """

    def complete() -> bool:
        return (target / marker).is_file()

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # unlike mkdtemp, honours the umask (the cache may be shared)
    try:
        write(tmp)
        if target.exists():
            if not force and complete():
                shutil.rmtree(tmp, ignore_errors=True)
                return target
            trash = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if complete():
            return target
        raise
    return target


def cache_entry(domain: str, name: str, recipe: dict[str, Any], cache_dir: Any = None) -> Path:
    """``<cache>/<domain>/<name>-<hash>``: the folder of a build whose inputs are ``recipe``
    (JSON-able; include a version number so that recipe changes invalidate old builds)."""
    key = json.dumps(recipe, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / domain / f"{name}-{digest}"


def merge_params(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with the non-None ``given`` values; unknown names raise."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}; valid: {sorted(defaults)}")
    return {**defaults, **{k: v for k, v in given.items() if v is not None}}
