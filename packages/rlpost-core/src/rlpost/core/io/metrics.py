"""Run metrics: one JSON object per step in ``metrics.jsonl``, mirrored to TensorBoard.

Shared by every domain's trainer. TensorBoard is optional: without the ``tensorboard``
package the JSONL file is still written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` (and TensorBoard scalars).

    On resume, lines past the resumed step are dropped so the file equals an
    uninterrupted run's.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= resume_step
            ]
            self.path.write_text("".join(k + "\n" for k in keep))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._fh = self.path.open("a")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: JSONL only
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._fh.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln] if path.exists() else []
