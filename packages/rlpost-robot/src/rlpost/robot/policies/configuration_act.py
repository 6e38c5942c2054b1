"""Settings of the ``act`` policy kind (lerobot's ACT, the lerobot extra,
:mod:`rlpost.robot.policies.act`): light, pydantic only."""

from __future__ import annotations

from pydantic import Field

from rlpost.core.io.schema import Strict
from rlpost.robot.policies.kinds import PolicyKind, register_policy_kind


class ActSettings(Strict):
    horizon: int = Field(4, ge=1)
    """Actions per chunk (a pretrained checkpoint's chunk size)."""
    dim_model: int = Field(64, ge=8)
    """ACT transformer width."""
    bc_steps: int = Field(3000, ge=1)
    """Behaviour-cloning steps of the cached BC policy."""
    pretrained: str | None = None
    """A lerobot ACT checkpoint to fine-tune instead of behaviour cloning one: the
    ``pretrained_model/`` folder ``lerobot-train`` writes (``config.json``,
    ``model.safetensors``, ``policy_preprocessor*``), trained on ``data`` (whose feature
    names place its inputs in the task's observation); ``horizon`` is its chunk size."""


register_policy_kind(
    PolicyKind(
        "act",
        ActSettings,
        build="rlpost.robot.pretrain:build_act_kind",
        load="rlpost.robot.policies.act:ActChunkPolicy.load",
    )
)
