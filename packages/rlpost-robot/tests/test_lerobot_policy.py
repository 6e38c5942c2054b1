"""The flow policy as a lerobot policy plugin: lerobot's own factory builds and loads it,
and it samples and trains exactly as our FlowChunkPolicy does."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("lerobot")

from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import make_policy, make_pre_post_processors

from rlpost.robot.envs import TASKS
from rlpost.robot.lerobot_data import obs_split
from rlpost.robot.lerobot_policy import (
    RlpostFlowConfig,
    RlpostFlowPolicy,
    save_flow_lerobot,
)
from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig

TASK = "reacher"


def _trained_like_flow(horizon=4, state_idx=None) -> FlowChunkPolicy:
    """A flow with non-trivial weights, normalisation and per-dimension clamps."""
    spec = TASKS[TASK]
    torch.manual_seed(0)
    pi = FlowChunkPolicy(
        FlowPolicyConfig(
            spec.obs_dim, spec.act_dim, horizon=horizon, hidden=32, n_blocks=2, n_steps=3,
            act_low=(-0.5, -1.0), act_high=(1.0, 0.25), state_idx=state_idx,
        )
    )  # fmt: skip
    with torch.no_grad():
        for p in pi.parameters():
            p.normal_(0, 0.3)
    pi.set_normalization(torch.randn(spec.obs_dim), torch.rand(spec.obs_dim) + 0.5)
    return pi.eval()


def _batch(obs: torch.Tensor) -> dict[str, torch.Tensor]:
    s, e = obs_split(TASK)
    return {"observation.state": obs[:, s], "observation.environment_state": obs[:, e]}


@pytest.fixture
def dataset_meta(tmp_path):
    from rlpost.robot.demos import collect_demos
    from rlpost.robot.lerobot_data import open_lerobot_dataset, write_lerobot_dataset

    root = write_lerobot_dataset(collect_demos(TASK, 1, 1, seed=0), tmp_path / "ds", TASK)
    return open_lerobot_dataset(root).meta


@pytest.mark.parametrize("state_idx", [None, (0, 1, 2, 3)])
def test_lerobots_factory_loads_the_flow_and_samples_the_same_chunks(
    tmp_path, dataset_meta, state_idx
):
    pi = _trained_like_flow(state_idx=state_idx)
    path = save_flow_lerobot(pi, TASK, tmp_path / "lerobot")
    cfg = PreTrainedConfig.from_pretrained(path)
    assert isinstance(cfg, RlpostFlowConfig) and cfg.type == "rlpost_flow"
    cfg.pretrained_path = path
    policy = make_policy(cfg, ds_meta=dataset_meta)  # lerobot's factory, from the checkpoint
    assert isinstance(policy, RlpostFlowPolicy)
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(path))
    obs = torch.randn(5, TASKS[TASK].obs_dim) * 2
    noise = torch.randn(5, 4, TASKS[TASK].act_dim)
    chunk = post(policy.predict_action_chunk(pre(_batch(obs)), noise=noise))
    want = pi.sample(obs, noise=noise)
    assert torch.equal(chunk, want)
    assert chunk.amin() < 0.99 and (chunk[..., 1] <= 0.25).all()  # the clamps travelled


def test_select_action_plays_a_chunk_then_samples_the_next():
    pi = _trained_like_flow(horizon=4)
    spec = TASKS[TASK]
    s, e = obs_split(TASK)
    from lerobot.configs import FeatureType, PolicyFeature

    cfg = RlpostFlowConfig(
        chunk_size=4, n_action_steps=2, num_inference_steps=3, hidden=32, n_blocks=2,
        obs_layout={"observation.state": s.tolist(), "observation.environment_state": e.tolist()},
        act_low=[-0.5, -1.0], act_high=[1.0, 0.25], device="cpu", push_to_hub=False,
        input_features={"observation.state": PolicyFeature(FeatureType.STATE, (len(s),)),
                        "observation.environment_state": PolicyFeature(FeatureType.ENV, (len(e),))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (spec.act_dim,))},
    )  # fmt: skip
    policy = RlpostFlowPolicy(cfg)
    policy.model.load_state_dict(pi.state_dict())
    obs = torch.randn(3, spec.obs_dim)
    torch.manual_seed(1)
    first = pi.sample(obs)
    torch.manual_seed(1)
    a0, a1 = policy.select_action(_batch(obs)), policy.select_action(_batch(obs))
    assert torch.equal(a0, first[:, 0]) and torch.equal(a1, first[:, 1])
    torch.manual_seed(2)
    second = pi.sample(obs)
    torch.manual_seed(2)
    assert torch.equal(policy.select_action(_batch(obs)), second[:, 0])  # a fresh chunk
    policy.reset()
    torch.manual_seed(1)
    assert torch.equal(policy.select_action(_batch(obs)), first[:, 0])


def test_forward_is_the_flow_matching_loss_with_padded_steps_masked(tmp_path):
    pi = _trained_like_flow(horizon=4)
    policy = RlpostFlowPolicy.from_pretrained(save_flow_lerobot(pi, TASK, tmp_path / "lr"))
    obs = torch.randn(6, TASKS[TASK].obs_dim)
    chunks = torch.rand(6, 4, 2) * 2 - 1
    pad = torch.zeros(6, 4, dtype=torch.bool)
    pad[:3, 2:] = True
    torch.manual_seed(3)
    loss, info = policy.forward({**_batch(obs), "action": chunks, "action_is_pad": pad})
    torch.manual_seed(3)
    want = pi.flow_loss(obs, chunks, mask=~pad)
    assert torch.allclose(loss, want) and info["flow_loss"] == pytest.approx(want.item())
    loss.backward()
    assert all(p.grad is not None for p in policy.parameters() if p.requires_grad)


def test_a_layout_that_misses_or_repeats_a_position_is_refused():
    with pytest.raises(ValueError, match="exactly once"):
        RlpostFlowConfig(obs_layout={"observation.state": [0, 0, 2]}).validate_features()
    with pytest.raises(ValueError, match="n_action_steps"):
        RlpostFlowConfig(chunk_size=4, n_action_steps=5)


def test_an_image_conditioned_flow_is_refused_in_one_line(tmp_path):
    spec = TASKS[TASK]
    pi = FlowChunkPolicy(FlowPolicyConfig(spec.obs_dim + 48, 2, image_shape=(4, 4, 3)))
    with pytest.raises(ValueError, match="image-conditioned flow has no lerobot copy"):
        save_flow_lerobot(pi, TASK, tmp_path / "x")


@pytest.mark.slow
def test_lerobot_train_trains_the_plugin_from_scratch_on_our_data_set(tmp_path):
    """lerobot's own training script, told where the plugin is, trains and saves it."""
    from rlpost.robot.demos import collect_demos
    from rlpost.robot.lerobot_data import write_lerobot_dataset

    root = write_lerobot_dataset(collect_demos(TASK, 2, 0, seed=0), tmp_path / "ds", TASK)
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "lerobot.scripts.lerobot_train", "--policy.type=rlpost_flow",
        "--policy.discover_packages_path=rlpost.robot.lerobot_policy",
        "--policy.push_to_hub=false", "--policy.device=cpu", f"--dataset.root={root}",
        "--dataset.repo_id=local/ds", "--steps=2", "--batch_size=4", "--save_freq=2",
        "--num_workers=0", f"--output_dir={out}", "--wandb.enable=false",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = out / "checkpoints" / "last" / "pretrained_model"
    assert json.loads((saved / "config.json").read_text())["type"] == "rlpost_flow"
    policy = RlpostFlowPolicy.from_pretrained(saved)
    obs = torch.as_tensor(np.zeros((1, TASKS[TASK].obs_dim), np.float32))
    assert policy.predict_action_chunk(_batch(obs)).shape == (1, 8, 2)
