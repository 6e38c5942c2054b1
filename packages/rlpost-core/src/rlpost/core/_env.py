"""Report which optional engines a domain package can use (for the apps' ``doctor``), and
the error raised when a feature needs one that is not installed."""

from __future__ import annotations

import importlib.metadata as md


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
