"""User data files checked before they are loaded: each problem named with its file and
line, in bounded memory (one row at a time, none over a configurable size), so that a
malformed file is one line at start instead of a traceback, or the kernel's OOM killer,
minutes in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from rlpost.core.io.config import ConfigError


def is_json_lines(path: str | Path) -> bool:
    """A JSON Lines file (``.jsonl`` / ``.ndjson``, or ``.json`` whose first character
    opens an object rather than an array)."""
    p = Path(path)
    if p.suffix in (".jsonl", ".ndjson"):
        return True
    if p.suffix != ".json":
        return False
    with open(p, "rb") as f:
        head = f.read(4096).lstrip()
    return not head.startswith(b"[")


def text_lines(
    path: str | Path, *, max_row_mb: float = 64.0, field: str = "data.path"
) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of ``path``, read at most ``max_row_mb`` at a
    time; :class:`ConfigError` (``field: file:line: what``) for a longer line or one that is
    not UTF-8."""
    limit = int(max_row_mb * 2**20)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; a directory raises here)
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from None
    with f:
        for lineno, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            where = f"{field}: {path}:{lineno}"
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise ConfigError(
                    f"{where}: a row of over {max_row_mb:g} MiB; rows are read whole, so "
                    "raise data.max_row_mb if it is meant to be that long"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
                ) from None
            yield lineno, text


def json_rows(
    path: str | Path, *, max_row_mb: float = 64.0, field: str = "data.path"
) -> Iterator[dict]:
    """The JSON object of each non-blank line of ``path`` (:func:`text_lines`), one at a
    time; :class:`ConfigError` (one line: ``field: file:line: what``) at the first line
    that is not one, or for a file with no rows."""
    rows = 0
    for lineno, text in text_lines(path, max_row_mb=max_row_mb, field=field):
        if not text.strip():
            continue
        where = f"{field}: {path}:{lineno}"
        try:
            row = json.loads(text)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            raise ConfigError(
                f"{where}: not JSON ({msg}{f' at column {col}' if col else ''})"
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        rows += 1
        yield row
    if not rows:
        raise ConfigError(f"{field}: {path} holds no rows")


def check_json_lines(
    path: str | Path, *, max_row_mb: float = 64.0, field: str = "data.path"
) -> int:
    """Check every row of ``path`` (:func:`json_rows`) without keeping any; returns how
    many there are."""
    return sum(1 for _ in json_rows(path, max_row_mb=max_row_mb, field=field))


__all__ = ["check_json_lines", "is_json_lines", "json_rows", "text_lines"]
