"""Settings of the ``gaussian`` policy kind (a Gaussian chunk policy with
log-probabilities for policy gradients, :mod:`rlpost.robot.policies.gaussian`): light,
pydantic only."""

from __future__ import annotations

from pydantic import Field

from rlpost.core.io.schema import Strict
from rlpost.robot.policies.kinds import PolicyKind, register_policy_kind


class GaussianSettings(Strict):
    horizon: int = Field(4, ge=1)
    """Actions per chunk."""
    hidden: int = Field(256, ge=8)
    """MLP width."""
    bc_steps: int = Field(3000, ge=1)
    """Behaviour-cloning steps of the cached BC policy (its mean)."""


register_policy_kind(
    PolicyKind(
        "gaussian",
        GaussianSettings,
        build="rlpost.robot.pretrain:build_gaussian_kind",
        load="rlpost.robot.policies.gaussian:GaussianChunkPolicy.load",
    )
)
