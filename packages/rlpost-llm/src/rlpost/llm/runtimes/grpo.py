"""The GRPO-family trainer as a runtime: one :class:`~rlpost.llm.trainer.Trainer` run,
reported as ``rlpost-llm train`` prints it (rank 0 only under ``torchrun``)."""

from __future__ import annotations

import os
from typing import Any


def report(result: dict[str, Any]) -> str:
    """A trainer's result as the command's closing lines (empty on ranks other than 0)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return ""  # data parallel (torchrun): rank 0 reports for the run
    lines = [result.get("summary", "")]
    if "eval_before" in result:
        lines.append(
            f"held-out greedy accuracy: {result['eval_before']:.3f} -> {result['eval_after']:.3f}"
        )
    setup = result.get("seconds_setup")
    lines.append(
        f"{result['steps']} steps in {result['seconds']:.0f} s of training"
        + (f" after {setup:.0f} s of set-up (model, data, workers)" if setup is not None else "")
        + f"; curves: {result.get('plot')}"
    )
    return "\n".join(lines)


def run(cfg: Any, *, resume: bool = False, overwrite: bool = False) -> str:
    from rlpost.llm.trainer import Trainer

    return report(Trainer(cfg, resume=resume, overwrite=overwrite).train())
