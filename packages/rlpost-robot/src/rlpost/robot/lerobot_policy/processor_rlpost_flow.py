"""Processors of ``rlpost_flow`` (found by lerobot's factory by this module's name):
lerobot's default pipelines (rename, batch, device, normalise / unnormalise, cpu). The
config's normalisation is the identity: the flow standardises observations itself."""

from __future__ import annotations

from typing import Any

from lerobot.processor import make_default_pre_post_processors

from .configuration_rlpost_flow import RlpostFlowConfig


def make_rlpost_flow_pre_post_processors(
    config: RlpostFlowConfig, dataset_stats: dict[str, dict[str, Any]] | None = None
) -> tuple[Any, Any]:
    return make_default_pre_post_processors(config, dataset_stats, normalizer_device=config.device)
