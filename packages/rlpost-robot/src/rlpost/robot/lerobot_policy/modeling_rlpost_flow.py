"""``RlpostFlowPolicy``: rlpost's flow-matching chunk policy as a lerobot ``PreTrainedPolicy``.

lerobot's factory finds it by the naming convention of its plugins
(``configuration_rlpost_flow`` -> ``modeling_rlpost_flow.RlpostFlowPolicy``), so once
:mod:`rlpost.robot.lerobot_policy` is imported, ``make_policy``,
``PreTrainedPolicy.from_pretrained``, ``lerobot-eval`` and ``lerobot-train`` use it as
any built-in policy. The network is :class:`~rlpost.robot.policies.flow.FlowChunkPolicy`
(``self.model``), so the weights are the same tensors under a ``model.`` prefix.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

from .configuration_rlpost_flow import RlpostFlowConfig


def flow_config(config: RlpostFlowConfig) -> FlowPolicyConfig:
    """The :class:`FlowPolicyConfig` of a lerobot ``rlpost_flow`` config."""
    act = config.output_features.get("action") if config.output_features else None
    if act is None:
        raise ValueError("an rlpost_flow config needs an 'action' output feature")
    return FlowPolicyConfig(
        obs_dim=config.obs_dim,
        act_dim=int(act.shape[0]),
        horizon=config.chunk_size,
        hidden=config.hidden,
        n_blocks=config.n_blocks,
        n_steps=config.num_inference_steps,
        act_low=None if config.act_low is None else tuple(config.act_low),
        act_high=None if config.act_high is None else tuple(config.act_high),
        time_dim=config.time_dim,
        state_idx=None if config.condition_idx is None else tuple(config.condition_idx),
    )


class RlpostFlowPolicy(PreTrainedPolicy):
    """lerobot's policy interface over a :class:`FlowChunkPolicy`: ``select_action``
    returns one action per call from a queue refilled with the first ``n_action_steps``
    of a sampled chunk; ``forward`` is the flow-matching loss on a batch of chunks."""

    config_class = RlpostFlowConfig
    name = "rlpost_flow"

    def __init__(self, config: RlpostFlowConfig, **_: Any):
        super().__init__(config)
        if not config.obs_layout:  # a fresh policy (lerobot-train): the features in order
            config.obs_layout, n = {}, 0
            for key, ft in (config.input_features or {}).items():
                size = int(ft.shape[0]) if len(ft.shape) == 1 else 0
                if size and key.startswith("observation."):
                    config.obs_layout[key] = list(range(n, n + size))
                    n += size
        config.validate_features()
        self.config = config
        self.model = FlowChunkPolicy(flow_config(config))
        self.reset()

    def reset(self) -> None:
        self._queue: deque[Tensor] = deque(maxlen=self.config.n_action_steps)

    def get_optim_params(self) -> Any:
        return self.parameters()

    def flat_obs(self, batch: dict[str, Tensor]) -> Tensor:
        """The flat observation ``[B, D]`` the network reads, assembled from the batch's
        features by ``config.obs_layout``."""
        parts = [(pos, batch[key]) for key, pos in self.config.obs_layout.items()]
        b = parts[0][1].shape[0]
        ref = self.model.obs_mean
        obs = torch.empty(b, self.config.obs_dim, dtype=ref.dtype, device=ref.device)
        for pos, x in parts:
            obs[:, pos] = x.reshape(b, -1).to(obs)
        return obs

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        """A chunk ``[B, chunk_size, A]``; ``noise`` (``[B, H, A]``) fixes the start."""
        self.eval()
        return self.model.sample(self.flat_obs(batch), noise=kwargs.get("noise"))

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        if not self._queue:
            chunk = self.predict_action_chunk(batch, **kwargs)[:, : self.config.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        mask = None
        if "action_is_pad" in batch:
            mask = ~batch["action_is_pad"].bool()
        loss = self.model.flow_loss(self.flat_obs(batch), batch["action"], mask=mask)
        return loss, {"flow_loss": float(loss.detach())}
