"""One line on stderr telling the user about a decision a run took."""

from __future__ import annotations

import sys


def notice(message: str) -> None:
    """Tell the user about a decision the run took, in one line on stderr."""
    print(f"rlpost: {message}", file=sys.stderr, flush=True)


__all__ = ["notice"]
