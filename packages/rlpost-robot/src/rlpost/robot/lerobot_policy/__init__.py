"""rlpost's flow policy as a lerobot policy plugin (type ``rlpost_flow``).

Importing this package registers ``RlpostFlowConfig`` with lerobot; its modules follow
lerobot's plugin naming (``configuration_`` / ``modeling_`` / ``processor_rlpost_flow``),
so lerobot's own factory (``make_policy``, ``get_policy_class``,
``make_pre_post_processors``) builds and loads the policy. lerobot's scripts load it
with ``--policy.discover_packages_path=rlpost.robot.lerobot_policy``.

:func:`save_flow_lerobot` writes a trained :class:`~rlpost.robot.policies.flow.FlowChunkPolicy`
in lerobot's checkpoint layout (``config.json``, ``model.safetensors``, the processor
pipelines); ``rlpost-robot train`` writes it to ``policy/lerobot/`` for flow policies.

Requires the ``lerobot`` extra (``pip install rlpost-robot[lerobot]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import lerobot.policies  # noqa: F401
except ImportError as exc:  # pragma: no cover - the default dev environment has lerobot
    from rlpost.core import MissingDependency

    raise MissingDependency(
        "rlpost.robot.lerobot_policy needs lerobot: pip install 'rlpost-robot[lerobot]'"
    ) from exc

from rlpost.robot.lerobot_policy.configuration_rlpost_flow import RlpostFlowConfig
from rlpost.robot.lerobot_policy.modeling_rlpost_flow import RlpostFlowPolicy
from rlpost.robot.lerobot_policy.processor_rlpost_flow import make_rlpost_flow_pre_post_processors

__all__ = [
    "RlpostFlowConfig",
    "RlpostFlowPolicy",
    "make_rlpost_flow_pre_post_processors",
    "save_flow_lerobot",
]


def _bound(b: Any, act_dim: int) -> list[float] | None:
    if b is None:
        return None
    return [float(b)] * act_dim if isinstance(b, int | float) else [float(x) for x in b]


def save_flow_lerobot(policy: Any, task: str, path_dir: str | Path) -> Path:
    """Write ``policy`` (a :class:`FlowChunkPolicy` of ``task``) as a lerobot
    ``rlpost_flow`` checkpoint in ``path_dir``: it reads ``observation.state`` /
    ``observation.environment_state`` in the layout of the task's LeRobotDatasets
    (:func:`rlpost.robot.lerobot_data.lerobot_features`) and writes ``action``.
    An image-conditioned flow is refused (lerobot cameras are not mapped yet)."""
    from lerobot.configs import FeatureType, PolicyFeature

    from rlpost.robot.lerobot_data import obs_split

    cfg = policy.cfg
    if cfg.image_shape is not None:
        raise ValueError(f"task {task}: an image-conditioned flow has no lerobot copy yet")
    state_idx, env_idx = (a.tolist() for a in obs_split(task))
    layout = {"observation.state": state_idx}
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (len(state_idx),))}
    if env_idx:
        layout["observation.environment_state"] = env_idx
        inputs["observation.environment_state"] = PolicyFeature(FeatureType.ENV, (len(env_idx),))
    config = RlpostFlowConfig(
        chunk_size=cfg.horizon, n_action_steps=cfg.horizon, num_inference_steps=cfg.n_steps,
        hidden=cfg.hidden, n_blocks=cfg.n_blocks, time_dim=cfg.time_dim, obs_layout=layout,
        condition_idx=None if cfg.state_idx is None else list(cfg.state_idx),
        act_low=_bound(cfg.act_low, cfg.act_dim), act_high=_bound(cfg.act_high, cfg.act_dim),
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (cfg.act_dim,))},
        device="cpu", push_to_hub=False,
    )  # fmt: skip
    lp = RlpostFlowPolicy(config)
    lp.model.load_state_dict(policy.state_dict())
    path = Path(path_dir)
    lp.save_pretrained(path)
    pre, post = make_rlpost_flow_pre_post_processors(config)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return path
