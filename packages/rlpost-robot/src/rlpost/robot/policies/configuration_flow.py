"""Settings of the ``flow`` policy kind (our flow-matching action-chunk policy,
:mod:`rlpost.robot.policies.flow`): light, pydantic only."""

from __future__ import annotations

from pydantic import Field

from rlpost.core.io.schema import Strict
from rlpost.robot.policies.kinds import PolicyKind, register_policy_kind


class FlowSettings(Strict):
    horizon: int = Field(4, ge=1)
    """Actions per chunk."""
    hidden: int = Field(256, ge=8)
    """MLP width."""
    bc_steps: int = Field(3000, ge=1)
    """Behaviour-cloning steps of the cached BC policy."""


register_policy_kind(
    PolicyKind(
        "flow",
        FlowSettings,
        build="rlpost.robot.pretrain:build_flow_kind",
        load="rlpost.robot.policies.flow:FlowChunkPolicy.load",
        multi_step=True,
        cache="bc",  # (the first kind: its cached BC policies keep their folders)
    )
)
