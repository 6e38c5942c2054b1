"""What the rlpost command-line apps share (standard library only): :class:`App`."""

from rlpost.apps.common.cli import App

__all__ = ["App"]
