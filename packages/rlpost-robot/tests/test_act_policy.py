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


def _small_act(task="contour", state_idx=None, seed=0):
    torch.manual_seed(seed)
    spec = TASKS[task]
    demos = collect_demos(task, n_good=1, n_poor=1, seed=seed)
    pi = ActChunkPolicy(spec.obs_dim, spec.act_dim, spec.env_obs, horizon=4, dim_model=32,
                        stats=act_stats(demos, spec.env_obs, state_idx), state_idx=state_idx)  # fmt: skip
    obs, chunks, mask = make_chunks(demos, 4)
    train_act_bc(pi, obs, chunks, mask, steps=5, batch_size=16)
    return pi, obs


def test_every_saved_act_is_a_lerobot_checkpoint_and_fine_tunes_from_one(tmp_path):
    """``policy/lerobot`` loads with lerobot's own ``ACTPolicy.from_pretrained`` and
    predicts what our policy predicts; ``from_lerobot`` on that folder (a checkpoint as
    lerobot-train writes it) is the same policy, and so is ``load`` of the saved folder."""
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    spec = TASKS["contour"]
    # the checkpoint's observation.state in another order than the task's split
    state_idx = (2, 1, 0, 3, 4, 5, 6)
    pi, obs = _small_act(state_idx=state_idx)
    folder = pi.save(tmp_path / "policy")
    theirs = ACTPolicy.from_pretrained(str(folder / "lerobot")).eval()
    pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(folder / "lerobot"))
    batch = {"observation.state": obs[:3][:, list(state_idx)],
             "observation.environment_state": obs[:3][:, list(spec.env_obs)]}  # fmt: skip
    with torch.no_grad():
        lerobot_chunk = post(theirs.predict_action_chunk(pre(batch))).clamp(-1, 1)
    torch.testing.assert_close(pi.sample(obs[:3]), lerobot_chunk)
    again = ActChunkPolicy.from_lerobot(folder / "lerobot", spec.obs_dim, spec.act_dim,
                                        state_idx, spec.env_obs)  # fmt: skip
    torch.testing.assert_close(again.sample(obs[:3]), pi.sample(obs[:3]))
    torch.testing.assert_close(again.mean_chunk(obs[:3]), pi.mean_chunk(obs[:3]))
    saved = again.save(tmp_path / "tuned")
    torch.testing.assert_close(ActChunkPolicy.load(saved).sample(obs[:3]), pi.sample(obs[:3]))
    with pytest.raises(ValueError, match=r"reads .*observation.state.*\(7,\).*maps to"):
        ActChunkPolicy.from_lerobot(folder / "lerobot", spec.obs_dim, spec.act_dim,
                                    (0, 1, 2), spec.env_obs)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="not a lerobot policy checkpoint"):
        ActChunkPolicy.from_lerobot(tmp_path, spec.obs_dim, spec.act_dim, state_idx, (7,))
