"""lerobot's ACT behind the chunk-policy interface, behaviour-cloned on our demonstrations."""

import numpy as np
import pytest
import torch

from rlpost.robot.algos.common import evaluate_policy
from rlpost.robot.demos import collect_demos
from rlpost.robot.envs import TASKS
from rlpost.robot.policies.act import ActChunkPolicy, act_stats, train_act_bc
from rlpost.robot.policies.bc import make_chunks


def test_act_clones_the_good_demonstrator_on_multimodal_reach():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = TASKS["multimodal_reach"]
    demos = collect_demos("multimodal_reach", n_good=20, n_poor=0, seed=0)
    pi = ActChunkPolicy(
        spec.obs_dim, spec.act_dim, spec.env_obs, horizon=4, stats=act_stats(demos, spec.env_obs)
    )
    obs, chunks, mask = make_chunks(demos, 4)
    losses = train_act_bc(pi, obs, chunks, mask, steps=300, batch_size=64)
    assert np.mean(losses[-30:]) < 0.5 * np.mean(losses[:30])
    chunk = pi.sample(obs[:5])
    assert chunk.shape == (5, 4, spec.act_dim) and chunk.abs().max() <= 1
    # through the same controller / evaluation as the flow policy
    ev = evaluate_policy(pi, "multimodal_reach", episodes=10, n_steps=1, seed=100)
    assert ev["success"] >= 0.3, ev  # the random policy succeeds 0 %


def test_state_only_act_needs_environment_state():
    with pytest.raises(ValueError, match="environment-state"):
        ActChunkPolicy(4, 2, env_idx=())
