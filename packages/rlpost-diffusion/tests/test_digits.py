"""The embedded digits flow model: net, policy, pretraining and its cache."""

import json
import os

import numpy as np
import pytest
import torch

import rlpost.diffusion.models.digits as digits
import rlpost.diffusion.models.digits.pretrained as pretrained
from rlpost.diffusion.models.base import FlowPolicy
from rlpost.diffusion.models.digits import (
    DigitsPolicy,
    DigitsVelocityNet,
    base_path,
    build_digits_base,
    build_digits_classifier,
    digits_split,
    euler_sample,
    load_digits_net,
    parse_digit_prompts,
    to_model_space,
)

SMALL_BASE = {"steps": 200}  # enough for recognisable digits, ~4 s on one core
TINY_BASE = {"steps": 10}  # for cache-mechanics tests


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="session")
def clf_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_digits_classifier(tmp_path_factory.mktemp("cache"), progress=False, steps=100)


@pytest.fixture(scope="session")
def small_base(tmp_path_factory, clf_dir):
    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("cache")
    path = build_digits_base(cache, progress=False, classifier=clf_dir, **SMALL_BASE)
    return cache, path


def _randomised(net: DigitsVelocityNet, seed: int = 0) -> DigitsVelocityNet:
    """The zero-init output layer makes v = 0; give it weights so outputs differ."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        net.out.weight.copy_(0.05 * torch.randn(net.out.weight.shape, generator=g))
    return net


# ----------------------------------------------------------------------------- data


def test_split_is_fixed_disjoint_and_in_range():
    s = digits_split()
    assert s.train_images.shape == (1500, 1, 8, 8) and s.heldout_images.shape == (297, 1, 8, 8)
    assert s.train_images.min() >= 0 and s.train_images.max() <= 1
    assert set(s.train_labels.tolist()) == set(range(10))
    assert digits_split.__wrapped__().train_labels.equal(s.train_labels)  # deterministic
    train_rows = {tuple(r) for r in s.train_images.flatten(1).tolist()}
    heldout_rows = [tuple(r) for r in s.heldout_images.flatten(1).tolist()]
    # (load_digits has a few exact duplicate images; nearly all held-out ones are unseen)
    assert sum(r in train_rows for r in heldout_rows) < 10
    x = to_model_space(s.train_images)
    assert x.min() == -1 and x.max() == 1
    assert DigitsPolicy.random().decode(x).equal(s.train_images)


# ----------------------------------------------------------------------------- net


def test_net_shapes_zero_init_and_size():
    net = DigitsVelocityNet()
    n_params = sum(p.numel() for p in net.parameters())
    assert 150_000 <= n_params <= 400_000
    x = torch.randn(5, 1, 8, 8)
    v = net(x, torch.rand(5), torch.arange(5))
    assert v.shape == x.shape
    assert torch.count_nonzero(v) == 0
    assert net(x, torch.tensor(0.5), torch.arange(5)).shape == x.shape  # scalar sigma
    _randomised(net)
    v0 = net(x, torch.full((5,), 0.2), torch.arange(5))
    assert not torch.allclose(v0, net(x, torch.full((5,), 0.8), torch.arange(5)))
    assert not torch.allclose(v0, net(x, torch.full((5,), 0.2), torch.arange(5) + 1))


# ----------------------------------------------------------------------------- policy


def test_policy_satisfies_protocol():
    policy = DigitsPolicy.random(seed=0)
    assert isinstance(policy, FlowPolicy)
    assert policy.sample_shape == (1, 8, 8)
    assert policy.trainable_module() is policy.net
    assert len(policy.trainable_parameters()) == len(list(policy.net.parameters()))
    cond = policy.encode([0, "7", np.int64(3), torch.tensor(9)])
    assert cond["labels"].dtype == torch.long
    assert cond["labels"].tolist() == [0, 7, 3, 9]
    img = policy.decode(torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.0]))
    assert img.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_reference_equals_velocity_then_stays_frozen():
    torch.manual_seed(0)
    policy = DigitsPolicy(_randomised(DigitsVelocityNet(hidden=64, n_blocks=2)))
    x, sigma = torch.randn(8, 1, 8, 8), torch.rand(8)
    cond = policy.encode(list(range(8)))
    ref0 = policy.reference_velocity(x, sigma, cond)
    assert torch.equal(policy.velocity(x, sigma, cond), ref0)
    assert not ref0.requires_grad
    assert all(not p.requires_grad for p in policy.reference.parameters())

    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    loss = (policy.velocity(x, sigma, cond) - 1.0).square().mean()
    loss.backward()
    opt.step()
    assert not torch.allclose(policy.velocity(x, sigma, cond), ref0)
    assert torch.equal(policy.reference_velocity(x, sigma, cond), ref0)


@pytest.mark.parametrize("bad", [10, -1, "seven", "", 3.0, True, None, "12"])
def test_encode_rejects_bad_prompts(bad):
    policy = DigitsPolicy.random()
    with pytest.raises(ValueError, match=r"invalid digit prompt .* at index 1"):
        policy.encode([1, bad])
    with pytest.raises(ValueError, match="1-D integer"):
        parse_digit_prompts(torch.tensor([1.0, 2.0]))


def test_euler_sample_is_seeded():
    policy = DigitsPolicy.random()
    _randomised(policy.net)
    labels = torch.arange(4)

    def run(seed):
        return euler_sample(policy.net, labels, 5, generator=torch.Generator().manual_seed(seed))

    assert run(0).shape == (4, 1, 8, 8)
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))


# ----------------------------------------------------------------------------- pretraining


def test_short_pretraining_learns(small_base):
    _, path = small_base
    info = json.loads((path / "base_info.json").read_text())
    assert (path / "velocity.safetensors").is_file()
    assert info["steps"] == SMALL_BASE["steps"]
    assert info["heldout_fm_loss"] < 0.6 * info["heldout_fm_loss_init"]
    samples = info["samples"]
    assert samples["class_accuracy"] > 0.3  # chance is 0.1
    assert 0 <= samples["geneval"] <= samples["class_accuracy"]
    net = load_digits_net(path)
    assert any(torch.count_nonzero(p) for p in net.out.parameters())
    assert net.config == info["net"]
    policy = DigitsPolicy(net)
    x = torch.randn(3, 1, 8, 8)
    assert policy.velocity(x, torch.rand(3), policy.encode([1, 2, 3])).shape == x.shape


def test_cached_build_is_reused_without_training(small_base, clf_dir, monkeypatch):
    cache, path = small_base
    mtime = (path / "velocity.safetensors").stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("a cached build must not retrain")

    monkeypatch.setattr(pretrained, "train_flow_matching", no_training)
    again = build_digits_base(cache, progress=False, classifier=clf_dir, **SMALL_BASE)
    assert again == path == base_path(cache, **SMALL_BASE)
    assert (path / "velocity.safetensors").stat().st_mtime_ns == mtime
    # a different recipe is a different folder
    assert base_path(cache, steps=SMALL_BASE["steps"] + 1) != path


def _counting_trainer(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = pretrained.train_flow_matching

    def trainer(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrained, "train_flow_matching", trainer)
    return calls


def test_force_rebuilds(tmp_path, clf_dir, monkeypatch):
    calls = _counting_trainer(monkeypatch)
    path = build_digits_base(tmp_path, progress=False, classifier=clf_dir, **TINY_BASE)
    stamp0 = (path / "base_info.json").stat().st_mtime_ns
    assert build_digits_base(tmp_path, progress=False, classifier=clf_dir, **TINY_BASE) == path
    assert len(calls) == 1
    rebuilt = build_digits_base(
        tmp_path, force=True, progress=False, classifier=clf_dir, **TINY_BASE
    )
    assert rebuilt == path and len(calls) == 2
    # rewritten (the timings inside may round to the same values on a fast machine)
    assert (path / "base_info.json").stat().st_mtime_ns != stamp0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp / old dirs left


def test_leftover_temp_and_incomplete_dirs_do_not_count(tmp_path, clf_dir, monkeypatch):
    calls = _counting_trainer(monkeypatch)
    target = base_path(tmp_path, **TINY_BASE)
    leftover = target.parent / f".{target.name}.tmp-1234-deadbeef"
    leftover.mkdir(parents=True)
    (leftover / "velocity.safetensors").write_bytes(b"partial")
    (leftover / "base_info.json").write_text("{}")  # even a "complete" temp dir is ignored
    target.mkdir()
    (target / "velocity.safetensors").write_bytes(b"interrupted")  # no base_info.json
    path = build_digits_base(tmp_path, progress=False, classifier=clf_dir, **TINY_BASE)
    assert path == target and len(calls) == 1
    assert json.loads((path / "base_info.json").read_text())["steps"] == TINY_BASE["steps"]
    load_digits_net(path)  # a real checkpoint replaced the interrupted one


def test_pretrained_builds_then_loads_from_cache(tmp_path, monkeypatch):
    monkeypatch.setitem(digits.BASE_DEFAULTS, "steps", 10)
    monkeypatch.setitem(digits.CLASSIFIER_DEFAULTS, "steps", 10)
    monkeypatch.setenv("RLPOST_CACHE", os.fspath(tmp_path))
    policy = DigitsPolicy.pretrained(progress=False)
    assert isinstance(policy, FlowPolicy)
    calls = _counting_trainer(monkeypatch)
    again = DigitsPolicy.pretrained(tmp_path, progress=False)
    assert calls == []
    for a, b in zip(policy.net.parameters(), again.net.parameters(), strict=True):
        assert torch.equal(a, b)
    assert {p.name.split("-")[0] for p in (tmp_path / "diffusion").iterdir()} == {"digits"}
