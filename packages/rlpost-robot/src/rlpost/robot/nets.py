"""Small network builders shared by the robot algorithms."""

from __future__ import annotations

from torch import nn


def mlp(inp: int, out: int, hidden: int, act: type[nn.Module] = nn.SiLU) -> nn.Sequential:
    """``inp -> hidden -> hidden -> out`` with ``act`` between the linear layers."""
    return nn.Sequential(
        nn.Linear(inp, hidden), act(), nn.Linear(hidden, hidden), act(), nn.Linear(hidden, out)
    )
