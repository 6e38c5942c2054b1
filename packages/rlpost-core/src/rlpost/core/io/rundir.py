"""The run directory every domain's trainer writes into."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def open_run_dir(path: str | os.PathLike, config: Any) -> Path:
    """Create ``path`` and write ``config.yaml`` (``config.to_yaml()``, a
    :class:`rlpost.core.io.schema.Strict` model) atomically: a temporary file, then a
    rename, so a crash never leaves half a config beside a run's checkpoints."""
    run = Path(path)
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / "config.yaml.tmp"
    tmp.write_text(config.to_yaml())
    tmp.replace(run / "config.yaml")
    return run
