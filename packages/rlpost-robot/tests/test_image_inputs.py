"""Image inputs: the flow policy conditions on a camera image carried in the observation."""

import numpy as np
import pytest
import torch

from rlpost.robot.demos import collect_demos
from rlpost.robot.envs import TASKS, make_env, render_frames
from rlpost.robot.policies.bc import train_bc
from rlpost.robot.policies.flow import FlowChunkPolicy, FlowPolicyConfig


def _spot_data(n: int, g: torch.Generator):
    """State (2, uninformative) + an 8x8x1 image with one bright pixel; the target chunk
    is the pixel's normalised (row, col): only the image tells it."""
    pos = torch.randint(0, 8, (n, 2), generator=g)
    img = torch.zeros(n, 8, 8, 1)
    img[torch.arange(n), pos[:, 0], pos[:, 1], 0] = 255.0
    state = torch.randn(n, 2, generator=g)
    obs = torch.cat([state, img.flatten(1)], 1)
    target = (pos.float() / 3.5 - 1.0)[:, None, :].expand(n, 2, 2).contiguous()
    return obs, target


def test_flow_policy_reads_the_image():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    obs, target = _spot_data(512, g)
    test_obs, test_target = _spot_data(128, g)
    errors = {}
    for name, shape in (("image", (8, 8, 1)), ("state only", None)):
        cfg = FlowPolicyConfig(
            obs_dim=66, act_dim=2, horizon=2, hidden=64, image_shape=shape, image_features=32
        )
        if shape is None:
            cfg = FlowPolicyConfig(obs_dim=66, act_dim=2, horizon=2, hidden=64, state_idx=(0, 1))
        pi = FlowChunkPolicy(cfg)
        train_bc(pi, obs, target, steps=400, batch_size=128, lr=3e-3, progress=False)
        pred = pi.sample(test_obs, n_steps=1)  # E[a | o]
        errors[name] = float(((pred - test_target) ** 2).mean())
    assert errors["image"] < 0.2 * errors["state only"], errors
    assert errors["state only"] > 0.3, errors  # the state carries no information


def test_state_idx_hides_entries_and_image_changes_the_output():
    cfg = FlowPolicyConfig(
        obs_dim=3 + 4 * 4 * 3,
        act_dim=1,
        horizon=2,
        hidden=16,
        image_shape=(4, 4, 3),
        state_idx=(0, 2),
    )
    pi = FlowChunkPolicy(cfg)
    torch.nn.init.normal_(pi.out[-1].weight)  # non-zero output layer
    obs = torch.rand(2, cfg.obs_dim) * 255
    noise = torch.randn(2, 2, 1)
    base = pi.sample(obs, n_steps=2, noise=noise)
    hidden = obs.clone()
    hidden[:, 1] += 100.0  # not in state_idx
    torch.testing.assert_close(pi.sample(hidden, n_steps=2, noise=noise), base)
    moved = obs.clone()
    moved[:, 3:] = 255 - moved[:, 3:]
    assert not torch.allclose(pi.sample(moved, n_steps=2, noise=noise), base)
    with pytest.raises(ValueError, match="image_shape"):
        FlowPolicyConfig(obs_dim=10, act_dim=1, image_shape=(4, 4, 3))
    with pytest.raises(ValueError, match="state_idx"):
        FlowPolicyConfig(obs_dim=5, act_dim=1, state_idx=(7,))


def test_pixel_task_appends_the_camera_image():
    if render_frames("multimodal_reach", lambda o: np.zeros(2), seed=0, steps=0) is None:
        pytest.skip("no OpenGL backend for MuJoCo on this machine")
    spec = TASKS["multimodal_reach_pixels"]
    assert spec.image_shape == (32, 32, 3) and spec.obs_dim == 8 + 32 * 32 * 3
    env, base = make_env("multimodal_reach_pixels"), make_env("multimodal_reach")
    obs, _ = env.reset(seed=3)
    base_obs, _ = base.reset(seed=3)
    np.testing.assert_allclose(obs[:8], base_obs, rtol=1e-6)
    img = obs[8:].reshape(32, 32, 3)
    assert img.max() > img.min() and img.min() >= 0 and img.max() <= 255
    other, _ = env.reset(seed=4)  # other goals: another picture
    assert np.abs(other[8:] - obs[8:]).max() > 0
    # the base task's scripted experts drive it (they read the state entries)
    demos = collect_demos("multimodal_reach_pixels", n_good=2, n_poor=0, seed=0)
    assert all(d.success for d in demos) and demos[0].obs.shape[1] == spec.obs_dim


def test_bc_on_the_pixel_task_builds_an_image_policy(tmp_path):
    if render_frames("multimodal_reach", lambda o: np.zeros(2), seed=0, steps=0) is None:
        pytest.skip("no OpenGL backend for MuJoCo on this machine")
    from rlpost.robot.pretrain import build_bc_policy, load_bc_policy

    folder = build_bc_policy(
        "multimodal_reach_pixels",
        cache_dir=tmp_path,
        progress=False,
        demos={"n_good": 1, "n_poor": 1},
        steps=5,
        hidden=32,
    )
    pi = load_bc_policy(folder)
    assert pi.cfg.image_shape == (32, 32, 3) and pi.cfg.state_idx == (0, 1, 2, 3)
    assert pi.image is not None


def test_render_frames_on_the_pixel_task_shows_the_policy_camera():
    if render_frames("multimodal_reach", lambda o: np.zeros(2), seed=0, steps=0) is None:
        pytest.skip("no OpenGL backend for MuJoCo on this machine")
    frames = render_frames("multimodal_reach_pixels", lambda o: np.zeros(2), seed=0, steps=2)
    assert len(frames) == 3 and frames[0].shape == (32, 32, 3) and frames[0].dtype == np.uint8
    # rendering still works afterwards (a failure would disable it for the process)
    assert render_frames("multimodal_reach", lambda o: np.zeros(2), seed=0, steps=1) is not None
