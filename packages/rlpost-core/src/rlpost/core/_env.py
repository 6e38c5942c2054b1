"""Report which optional engines a domain package can use (for the apps' ``doctor``)."""

from __future__ import annotations

import importlib.metadata as md


def versions(dists: list[str]) -> dict[str, str]:
    """Installed version of each distribution, or ``'not installed'``."""
    out = {}
    for d in dists:
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = "not installed"
    return out
