"""Run metrics: one JSON object per step in ``metrics.jsonl``, mirrored to TensorBoard and
Weights & Biases.

Shared by every domain's trainer (:meth:`MetricsLogger.for_run` reads a run config's
``report_to``). TensorBoard is optional: without the ``tensorboard`` package the JSONL file
is still written. W&B (the ``rlpost-core[wandb]`` extra) runs offline by default, into
``<run.dir>/wandb``; a resumed run continues the same W&B run (its id is kept in
``<run.dir>/wandb-run-id``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` (and TensorBoard scalars).

    On resume, lines past the resumed step are dropped so the file equals an
    uninterrupted run's, and so is a line an interrupted write left torn (a full disk, a
    kill mid-write), with a notice naming it.
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resume_step: int | None = None,
        wandb: dict[str, Any] | None = None,
    ):
        """``wandb``: ``wandb.init`` settings (``project``, ``mode``, ``config``) to mirror
        the metrics to W&B, or None."""
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            rows, torn = _parse(self.path)
            if torn:
                from rlpost.core.io.rundir import notice

                notice(f"{self.path}: dropped unreadable line(s) {torn} (an interrupted write)")
            keep = [ln for ln, row in rows if row["step"] <= resume_step]
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
        self.wb = _start_wandb(run_dir, wandb) if wandb is not None else None

    @classmethod
    def for_run(cls, run_dir: Path, run: Any, resume_step: int | None = None) -> MetricsLogger:
        """The logger a run config's ``run`` section asks for (``report_to``, and the older
        ``tensorboard`` switch, which turns TensorBoard off when false)."""
        to = set(getattr(run, "report_to", ["jsonl", "tensorboard"]))
        tb = "tensorboard" in to and getattr(run, "tensorboard", True)
        wb = None
        if "wandb" in to:
            wb = {"project": run.wandb_project, "mode": run.wandb_mode}
        return cls(Path(run_dir), tb, resume_step, wandb=wb)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.wb is not None:
            self.wb.log(
                {k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step
            )

    def close(self) -> None:
        self._fh.close()
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()
            self.wb = None


def _start_wandb(run_dir: Path, settings: dict[str, Any]) -> Any:
    """A W&B run writing into ``run_dir/wandb``; the same run again on resume."""
    import uuid

    import wandb

    id_file = run_dir / "wandb-run-id"
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    config = {}
    cfg_file = run_dir / "config.yaml"
    if cfg_file.is_file():
        import yaml

        config = yaml.safe_load(cfg_file.read_text()) or {}
    return wandb.init(
        project=settings.get("project", "rlpost"),
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        mode=settings.get("mode", "offline"),
        config=config,
        settings=wandb.Settings(silent=True, console="off"),
    )


def _parse(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[int]]:
    """``metrics.jsonl``'s rows (each line and its object) and the numbers of the lines
    that are not a row (torn by an interrupted write)."""
    rows, torn = [], []
    for i, ln in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not ln:
            continue
        try:
            row = json.loads(ln)
        except ValueError:
            torn.append(i)
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append((ln, row))
        else:
            torn.append(i)
    return rows, torn


def step_rows(path: Path) -> list[dict[str, Any]]:
    """The ``{"step": int, ...}`` rows of a JSONL file (lines torn by an interrupted write
    left out; none when the file is missing)."""
    path = Path(path)
    return [row for _, row in _parse(path)[0]] if path.exists() else []


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (lines torn by an interrupted write left out)."""
    return step_rows(Path(run_dir) / "metrics.jsonl")
