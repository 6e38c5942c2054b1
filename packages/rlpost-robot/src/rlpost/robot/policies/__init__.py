"""Robot policies: the flow-matching action-chunk policy, its BC trainer and controller."""

from rlpost.robot.policies.bc import ChunkController, make_chunks, train_bc
from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

__all__ = ["ChunkController", "FlowChunkPolicy", "FlowPolicyConfig", "make_chunks", "train_bc"]
