"""Robot policies: the flow-matching action-chunk policy, its BC trainer and controller,
and the policy-kind registry (:mod:`rlpost.robot.policies.kinds`: each kind's light
``configuration_<kind>.py`` and its modeling module).

The modeling names below load on first use (PEP 562), so that importing a configuration
module (or :mod:`rlpost.robot.config`) imports no torch."""

from __future__ import annotations

import importlib
from typing import Any

from rlpost.robot.policies import (  # noqa: F401  (each registers its policy kind)
    configuration_act,
    configuration_flow,
    configuration_gaussian,
)

_LAZY = {
    "ChunkController": "rlpost.robot.policies.bc",
    "make_chunks": "rlpost.robot.policies.bc",
    "train_bc": "rlpost.robot.policies.bc",
    "FlowChunkPolicy": "rlpost.robot.policies.flow",
    "FlowPolicyConfig": "rlpost.robot.policies.flow",
}

__all__ = ["ChunkController", "FlowChunkPolicy", "FlowPolicyConfig", "make_chunks", "train_bc"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
